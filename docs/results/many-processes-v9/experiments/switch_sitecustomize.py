import os, sys
if os.environ.get("TR_SWITCH"):
    sys.setswitchinterval(float(os.environ["TR_SWITCH"]))
