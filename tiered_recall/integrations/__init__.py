"""Adapters that let agent frameworks use a TieredMemory: LangGraph (langgraph.py), LangChain (langchain.py) and
MCP (mcp_server.py); each needs its extra (pip install "tiered-recall[langgraph]", ...)."""
