import os, time, atexit, contextlib
if os.environ.get("TR_PUBPROBE"):
    from tiered_recall.coordinator.link import HotLink
    import tiered_recall.coordinator.link as L
    rows = []
    real_publish = HotLink.publish
    def publish(self, bump, own_side=None):
        st = {"lock": 0, "got": 0, "lockwait": 0.0, "held": 0.0}
        real_held = self.write_lock.held
        @contextlib.contextmanager
        def held(**kw):
            t0 = time.perf_counter()
            with real_held(**kw) as got:
                t1 = time.perf_counter()
                st["lock"] += 1; st["got"] += bool(got); st["lockwait"] += t1 - t0; st["wait"] = kw.get("wait", True)
                try:
                    yield got
                finally:
                    st["held"] += time.perf_counter() - t1
        self.write_lock.held = held
        left0 = self.logged.left_to_others if self.logged else 0
        wb = None
        if bump is not None and bump.record_end is not None and self.logged is not None:
            wb = self.logged.waiting_bytes(bump.record_end)
        t0 = time.perf_counter()
        try:
            return real_publish(self, bump, own_side)
        finally:
            dt = time.perf_counter() - t0
            self.write_lock.held = real_held
            rows.append((dt, wb, self._crowded(), (self.logged.left_to_others if self.logged else 0) - left0,
                         st["lock"], st["got"], st.get("wait"), st["lockwait"], st["held"]))
    HotLink.publish = publish
    def dump():
        with open(f"/tmp/pubprobe/out-{os.getpid()}.txt", "w") as f:
            for r in rows:
                f.write(repr(r) + "\n")
    atexit.register(dump)
