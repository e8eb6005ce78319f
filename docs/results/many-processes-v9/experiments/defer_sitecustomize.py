import os
if os.environ.get("TR_DEFER"):
    import tiered_recall.coordinator.link as L
    L.DEFERRED_LOG_BYTES = int(os.environ["TR_DEFER"])
