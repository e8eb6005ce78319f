#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck on the CUDA sidecar process itself (not just its Python
# client): cuda_sanitize_workload.py --wrapper makes start_sidecar run tr-sidecar under the sanitizer,
# with benchmarks/cuda_sanitize_workload.py as the workload. Logs go under $OUT (default results/gpu).
set -u
out=${OUT:-results/gpu}
mkdir -p "$out"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$out/install.log" 2>&1 || { tail -40 "$out/install.log"; exit 1; }
bin=$(python3 -c "from tiered_recall.hot.native import sidecar_executable; print(sidecar_executable())")
echo "backends: $("$bin" --backends)"
# does the segment registration (zero-copy results) take effect on this machine?
timeout 20 "$bin" --name zc-check-$$ --dim 768 --capacity 1000 --backend cuda --verbose --cuda-verbose \
  --exit-when-orphaned 1 2>&1 | head -5
status=0
for tool in memcheck racecheck; do
  wrapper="compute-sanitizer --tool $tool --error-exitcode 99 --log-file $out/sanitizer-$tool-%p.log"
  timeout 200 python3 benchmarks/cuda_sanitize_workload.py --wrapper "$wrapper" > "$out/workload-$tool.log" 2>&1
  rc=$?
  echo "$tool: workload exit $rc ($(tail -1 "$out/workload-$tool.log"))"
  grep -H "SUMMARY\|Target application returned" "$out"/sanitizer-$tool-*.log
  [ "$rc" -eq 0 ] || status=1
done
exit $status
