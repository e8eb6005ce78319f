"""Readers of the chat apps' own data exports: ChatGPT's and Claude's conversations.json, recognised by their shape.

chatgpt  a conversation {title, create_time, current_node, mapping: {node id: {message, parent, children}}, id or
         conversation_id}. The mapping is a tree (an edited message or a regenerated answer starts a branch); the
         branch read is the one the user kept: from current_node up to the root, reversed. Nodes without a message
         (the root) are passed over; hidden messages, system and tool messages and the assistant's calls to tools
         (recipient other than "all") are the app's scaffolding, skipped unless keep_system; content types other than
         text and multimodal_text (code, execution output, browsing results, reasoning) are skipped, and within a
         message every part that is not text (an image, a file, an audio clip) is left out and counted.
claude   a conversation {uuid, name, created_at, chat_messages: [{uuid, sender: "human" | "assistant", text,
         content: [{type, text}, ...], created_at, attachments, files}]}: the text parts of content (else text) are
         the turn; other parts (tool use and results, thinking, images) and attachments are left out and counted.
Both key a turn by its conversation's id and its own message id, so a later export of the same conversation (more
turns, a new branch) adds only what is new. Roles become user / assistant / system / tool, the export's own word
kept in metadata as original_role; the conversation's title is kept as metadata title, its id is {conversation}
and the session.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .sources import Source
from .turns import Turn
from .values import FieldMap, ReadState, RecordProblem, SkippedTurn, check_text, describe, parse_time, scalar_text

ROLES = {"user": "user", "human": "user", "assistant": "assistant", "model": "assistant", "system": "system",
         "tool": "tool", "function": "tool"}
CHATGPT_TEXT_CONTENT = ("text", "multimodal_text")
CHATGPT_EVERYONE = "all"  # a message's recipient when it is said in the chat, not sent to a tool
_NO_TEXT = "no text (empty content, e.g. a tool call)"
_ONLY_OTHER_PARTS = "no text (only images, files or other parts that are not text)"


@dataclass(frozen=True, slots=True)
class SkippedParts:
    """Parts of a stored or skipped message left out because they are not text (an image, a file, a tool call):
    counted per kind in the summary, never a turn of their own."""

    kind: str
    count: int = 1


def looks_like_chatgpt(value: dict[str, Any]) -> bool:
    """A ChatGPT export's conversation: a mapping of nodes and the node the user was on."""
    return isinstance(value.get("mapping"), dict) and ("current_node" in value or "title" in value)


def looks_like_claude(value: dict[str, Any]) -> bool:
    """A Claude export's conversation: its chat_messages and its uuid or name."""
    return isinstance(value.get("chat_messages"), list) and ("uuid" in value or "name" in value)


def _role(raw: Any, field_name: str) -> tuple[str | None, str | None]:
    """(the normalised role, the export's own word)."""
    original = scalar_text(raw, field_name)
    if original is None:
        return None, None
    return ROLES.get(original.lower(), original.lower()), original


def _conversation_id(value: dict[str, Any], names: tuple[str, ...], *, source: Source, ordinal: int) -> str:
    for name in names:
        found = scalar_text(value.get(name), name)
        if found:
            return found
    return f"{source.name}#{ordinal}"


def _title(value: dict[str, Any], name: str) -> str | None:
    title = value.get(name)
    return title.strip() or None if isinstance(title, str) else None


def _already_read(key: str, count: int, *, source: Source, line: int, state: ReadState) -> list[SkippedTurn] | None:
    """Skipped turns for a conversation id read before in this run (first wins, as in the other formats); None for
    one read now for the first time."""
    if key in state.seen_conversations:
        return [SkippedTurn(f"conversation id repeated (first read at {state.seen_conversations[key]})")] * count
    state.seen_conversations[key] = f"{source.display}:{line}"
    return None


def _chatgpt_branch(mapping: dict[str, Any], current: Any) -> list[tuple[str, dict[str, Any]]]:
    """The nodes from the root to current_node (without one: to the newest leaf, following each node's last child)."""
    if current is None:
        roots = [node_id for node_id, node in mapping.items() if isinstance(node, dict) and node.get("parent") is None]
        if not roots:
            raise RecordProblem("the conversation has no current_node and its mapping no root node (parent null)")
        current = roots[0]
        while True:
            children = mapping[current].get("children") if isinstance(mapping.get(current), dict) else None
            if not isinstance(children, list) or not children or children[-1] not in mapping:
                break
            current = children[-1]
    branch: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    node_id = current
    while node_id is not None:
        if not isinstance(node_id, str) or node_id not in mapping:
            where = "current_node" if not branch else f"node {branch[-1][0]!r}'s parent"
            raise RecordProblem(f"{where} {node_id!r} is not in the conversation's mapping")
        if node_id in seen:
            raise RecordProblem(f"the mapping's parent links loop back to node {node_id!r}")
        seen.add(node_id)
        node = mapping[node_id]
        if not isinstance(node, dict):
            raise RecordProblem(f"mapping[{node_id!r}] must be an object {{message, parent, children}}, got "
                                f"{describe(node)}")
        branch.append((node_id, node))
        node_id = node.get("parent")
    branch.reverse()
    return branch


def _chatgpt_text(content: dict[str, Any], where: str) -> tuple[str, list[str]]:
    """A text or multimodal_text content's text, and the kinds of the parts that are not text."""
    parts = content.get("parts")
    if parts is None:
        return "", []
    if not isinstance(parts, list):
        raise RecordProblem(f"{where}: content.parts must be a list, got {describe(parts)}")
    pieces: list[str] = []
    others: list[str] = []
    for part in parts:
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, dict) and part.get("content_type") == "audio_transcription" \
                and isinstance(part.get("text"), str):
            pieces.append(part["text"])  # what was said in voice mode
        elif isinstance(part, dict):
            others.append(str(part.get("content_type") or "object"))
        else:
            others.append(describe(part))
    return "\n".join(piece for piece in pieces if piece.strip()), others


def read_chatgpt(value: Any, *, source: Source, line: int, ordinal: int, fields: FieldMap,
                 state: ReadState) -> Iterator[Turn | SkippedTurn | SkippedParts]:
    """The turns of one ChatGPT conversation, on the branch the user kept."""
    if not isinstance(value, dict) or not isinstance(value.get("mapping"), dict):
        raise RecordProblem(f"expected a ChatGPT conversation with a 'mapping' object, got {describe(value)}")
    branch = _chatgpt_branch(value["mapping"], value.get("current_node"))
    key = _conversation_id(value, ("conversation_id", "id"), source=source, ordinal=ordinal)
    repeated = _already_read(key, sum(1 for _, node in branch if node.get("message") is not None), source=source,
                             line=line, state=state)
    if repeated is not None:
        yield from repeated
        return
    title = _title(value, "title")
    for node_id, node in branch:
        message = node.get("message")
        if message is None:
            continue  # the root, or a node the app keeps for structure: no turn
        where = f"mapping[{node_id!r}].message"
        if not isinstance(message, dict):
            raise RecordProblem(f"{where} must be an object, got {describe(message)}")
        yield from _chatgpt_message(message, node_id=node_id, where=where, key=key, title=title, source=source,
                                    line=line, fields=fields)


def _chatgpt_message(message: dict[str, Any], *, node_id: str, where: str, key: str, title: str | None,
                     source: Source, line: int, fields: FieldMap) -> Iterator[Turn | SkippedTurn | SkippedParts]:
    author = message.get("author")
    if not isinstance(author, dict):
        raise RecordProblem(f"{where}.author must be an object {{role, name}}, got {describe(author)}")
    role, original_role = _role(author.get("role"), "author.role")
    meta = message.get("metadata") if isinstance(message.get("metadata"), dict) else {}
    recipient = message.get("recipient")
    if meta.get("is_visually_hidden_from_conversation"):
        if not fields.keep_system:
            yield fields.skipped_unless_kept("hidden message (the app's own, not shown in the chat)")
            return
    elif role in ("system", "tool") or (recipient not in (None, CHATGPT_EVERYONE)):
        if not fields.keep_system:
            yield fields.skipped_unless_kept("system or tool message")
            return
    content = message.get("content")
    if not isinstance(content, dict):
        raise RecordProblem(f"{where}.content must be an object {{content_type, parts}}, got {describe(content)}")
    content_type = str(content.get("content_type") or "")
    if content_type not in CHATGPT_TEXT_CONTENT:
        yield SkippedTurn(f"not text ({content_type or 'unknown'} content)")
        return
    text, others = _chatgpt_text(content, where)
    for kind in others:
        yield SkippedParts(kind)
    text = check_text(text).strip()
    if not text:
        yield SkippedTurn(_ONLY_OTHER_PARTS if others else _NO_TEXT)
        return
    metadata: dict[str, Any] = {"source": source.name, "original_role": original_role}
    if title:
        metadata["title"] = title
    if isinstance(author.get("name"), str) and author["name"]:
        metadata["author_name"] = author["name"]
    if recipient not in (None, CHATGPT_EVERYONE):
        metadata["recipient"] = recipient
    yield Turn(
        source=source.display, line=line, conversation_key=key, position=node_id, text=text, role=role, session=key,
        created_at=parse_time(message.get("create_time"), field_name=f"{where}.create_time"), metadata=metadata,
        conversation=key,
    )


def read_claude(value: Any, *, source: Source, line: int, ordinal: int, fields: FieldMap,
                state: ReadState) -> Iterator[Turn | SkippedTurn | SkippedParts]:
    """The turns of one Claude conversation."""
    if not isinstance(value, dict) or not isinstance(value.get("chat_messages"), list):
        raise RecordProblem(f"expected a Claude conversation with a 'chat_messages' list, got {describe(value)}")
    messages = value["chat_messages"]
    key = _conversation_id(value, ("uuid", "id"), source=source, ordinal=ordinal)
    repeated = _already_read(key, len(messages), source=source, line=line, state=state)
    if repeated is not None:
        yield from repeated
        return
    title = _title(value, "name")
    for index, message in enumerate(messages):
        where = f"chat_messages[{index}]"
        if not isinstance(message, dict):
            raise RecordProblem(f"{where} must be an object {{uuid, sender, text, content}}, got {describe(message)}")
        yield from _claude_message(message, index=index, where=where, key=key, title=title, source=source, line=line,
                                   fields=fields)


def _claude_text(message: dict[str, Any], where: str) -> tuple[str, list[str]]:
    """The message's text parts (else its text field), and the kinds of what is not text."""
    others = [kind for kind in ("attachments", "files") for _ in (message.get(kind) or [])]
    content = message.get("content")
    if isinstance(content, list) and content:
        pieces: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            else:
                others.append(str(part.get("type") or "object") if isinstance(part, dict) else describe(part))
        return "\n".join(piece for piece in pieces if piece.strip()), others
    text = message.get("text")
    if text is not None and not isinstance(text, str):
        raise RecordProblem(f"{where}.text must be a string, got {describe(text)}")
    return text or "", others


def _claude_message(message: dict[str, Any], *, index: int, where: str, key: str, title: str | None,
                    source: Source, line: int, fields: FieldMap) -> Iterator[Turn | SkippedTurn | SkippedParts]:
    role, original_role = _role(message.get("sender"), f"{where}.sender")
    text, others = _claude_text(message, where)
    for kind in others:
        yield SkippedParts(kind)
    if role in ("system", "tool") and not fields.keep_system:
        yield fields.skipped_unless_kept("system or tool message")
        return
    text = check_text(text).strip()
    if not text:
        yield SkippedTurn(_ONLY_OTHER_PARTS if others else _NO_TEXT)
        return
    metadata: dict[str, Any] = {"source": source.name, "original_role": original_role}
    if title:
        metadata["title"] = title
    position = scalar_text(message.get("uuid"), f"{where}.uuid") or str(index)
    yield Turn(
        source=source.display, line=line, conversation_key=key, position=position, text=text, role=role, session=key,
        created_at=parse_time(message.get("created_at"), field_name=f"{where}.created_at"), metadata=metadata,
        conversation=key,
    )
