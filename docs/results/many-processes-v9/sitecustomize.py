"""A/B patch for the ninth session's measurements: TR_HACK=before restores the code before it (4239d83) in this
installation: searches promote their cold hits into a CPU sidecar with no core to spare; the log waiting to be
applied counts as unknown (infinite) across a rotation of the log; a crowded writer with much of the log waiting
queues for the store's write lock. TR_HACK=promote restores only the promotions. Put this folder on PYTHONPATH;
spawned workers inherit both."""
import os
import time

HACK = os.environ.get("TR_HACK", "")

if HACK in ("before", "promote"):
    from tiered_recall.coordinator.memory import TieredMemory

    real_after_cold_path = TieredMemory._after_cold_path
    shared_rule = TieredMemory.__dict__["_sidecar_takes_a_core"]

    def after_cold_path(self, hot, *args, **kwargs):
        # the rule stays for _own_copy_cheaper (4239d83 had it there); only the promotions ignore it
        TieredMemory._sidecar_takes_a_core = staticmethod(lambda hot: False)
        try:
            return real_after_cold_path(self, hot, *args, **kwargs)
        finally:
            TieredMemory._sidecar_takes_a_core = shared_rule

    TieredMemory._after_cold_path = after_cold_path

if HACK == "before":
    from tiered_recall.coordinator import link as L
    from tiered_recall.coordinator.hot_writes import LoggedWrites

    def waiting_bytes(self, end):
        applied = self.certs.applied()
        if applied is None or applied[0] != end[0]:
            return float("inf")
        return max(0, end[1] - applied[1])

    def publish(self, bump, own_side=None):
        if self.hot is not None:
            self.hot.note_work()
        if bump is None:
            return True
        if self.logged is None:
            return False
        if bump.record_end is not None:
            crowded = self._crowded()
            deadline = time.monotonic() + (0.0 if crowded else L.PUBLISH_WAIT_S)
            while not self.logged.covers(bump.record_end):
                late = time.monotonic() >= deadline
                leave = late and self.logged.waiting_bytes(bump.record_end) <= L.DEFERRED_LOG_BYTES
                if leave and crowded:
                    return self._leave_to_others(bump)
                with self.write_lock.held(wait=late and not leave) as got:
                    if got:
                        return self.logged.covers(bump.record_end) or \
                            self.call(lambda hot: self.logged.apply_with_latecomers(hot, self.epoch)) is not None
                if leave:
                    return self._leave_to_others(bump)
                time.sleep(L.HOLDER_POLL_S)
            return True
        if bump.note_at is not None and own_side is not None:
            with self.write_lock.held():
                done = self.call(lambda hot: self.logged.apply(hot, self.epoch, own_note=bump.note_at,
                                                               own_side=lambda: own_side(hot)))
                return bool(done)
        return False

    LoggedWrites.waiting_bytes = waiting_bytes
    L.HotLink.publish = publish
