"""Summary of the lock-hold probe: per run folder (l-*.txt or holds.txt.gz, and row.json), the add and delete holds
of the append lock: CPU and wall time inside, and the wait for it."""
import glob, collections, sys, json, gzip
q=lambda a,p:sorted(a)[min(len(a)-1,int(p*len(a)))]
for d in sys.argv[1:]:
    rows=[]
    for f in glob.glob(d+"/l-*.txt") + glob.glob(d+"/holds.txt.gz"):
        for line in (gzip.open(f, "rt") if f.endswith(".gz") else open(f)):
            p=line.split()
            if p[0]=="wal" and p[5].startswith(("_add_logged","_delete_logged","_flush_locked")): rows.append((p[5].split(">")[0],float(p[2]),float(p[3]),float(p[4])))
    row=json.loads(open(d+"/row.json").read().split("\n")[0].split("Error")[0])
    span=8.0
    out=[d.split("/")[-1], "ops %d add p99 %.1f own %.1f" % (row["aggregate_ops_per_s"], row["add_p99_ms"], row["add_own_p99_ms"])]
    for k in ("_add_logged","_delete_logged"):
        rs=[r for r in rows if r[0]==k]
        cpu=[r[3] for r in rs]; hold=[r[2] for r in rs]; wait=[r[1] for r in rs]
        out.append(f"{k[1:4]} n={len(rs)} cpu p50 {q(cpu,.5):.3f} hold p50 {q(hold,.5):.2f} p99 {q(hold,.99):.1f} wait p50 {q(wait,.5):.2f} p99 {q(wait,.99):.1f}")
    allhold=sum(r[2] for r in rows if r[0] != "_flush_locked")
    out.append("writes' hold sum %.0f ms" % allhold)
    print(" | ".join(out))
