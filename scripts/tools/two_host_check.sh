#!/usr/bin/env bash
# Two hosts on one Linux machine, and zero_ref run across them (root needed):
#
#   bash scripts/tools/two_host_check.sh [OUT]    # as root; default OUT: two_host_out/
#
# 1. Builds two network namespaces, zr_h1 and zr_h2, joined by a veth pair (10.77.0.1
#    and 10.77.0.2, device zr0 on both sides), each process in its own UTS namespace
#    with hostname h1 or h2, and the two names in /etc/hosts (restored afterwards).
# 2. Runs a deterministic stage-3 job on 4 ranks, 2 per host, with mpiexec in h1 and
#    the remote proxy started in h2 through a launcher that enters the namespace (in
#    place of ssh). UCX is forced onto TCP over zr0 (UCX_TLS=tcp), so the ranks on
#    different hosts really exchange their bytes over the link.
# 3. Runs the same job on one host and compares the two exports byte for byte.
# 4. Makes a rank on h2 raise at step 3, FAULT_RUNS times (default 10), and counts the
#    runs whose output holds that rank's message (it must arrive every time).
# 5. Prints the bytes that crossed the link (zr0's counters in h1) and one JSON line;
#    exits 0 only if the exports are equal and every failure message arrived.
# Everything it made (namespaces, the veth, /etc/hosts lines, the launcher) is
# removed on exit, whatever happens. See docs/multihost.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "${1:-two_host_out}")
mkdir -p "$OUT"
PY=${PYTHON:-$(command -v python)}
BIN=$(dirname "$PY")
MPIEXEC="$BIN/mpiexec"
[ "$(id -u)" = 0 ] || { echo "two_host_check.sh: needs root (network namespaces)" >&2; exit 2; }
[ -x "$MPIEXEC" ] || { echo "two_host_check.sh: no mpiexec beside $PY (pip install -e '.[mpich]')" >&2; exit 2; }

LAUNCHER="$OUT/netns_rsh"
FAULT_RUNS=${FAULT_RUNS:-10}  # runs in which rank 3 (on h2) raises at step 3
HOSTS_BACKUP="$OUT/etc_hosts.backup"
cleanup() {
    ip netns del zr_h1 2>/dev/null || true
    ip netns del zr_h2 2>/dev/null || true
    if [ -f "$HOSTS_BACKUP" ]; then cat "$HOSTS_BACKUP" > /etc/hosts && rm -f "$HOSTS_BACKUP"; fi
    rm -f "$LAUNCHER"
}
trap cleanup EXIT
cleanup  # leftovers of an interrupted earlier run

# ---- 1. two hosts
ip netns add zr_h1
ip netns add zr_h2
ip link add zr0 netns zr_h1 type veth peer name zr0 netns zr_h2
ip -n zr_h1 addr add 10.77.0.1/24 dev zr0
ip -n zr_h2 addr add 10.77.0.2/24 dev zr0
for ns in zr_h1 zr_h2; do ip -n $ns link set lo up; ip -n $ns link set zr0 up; done
for _ in $(seq 50); do  # a veth comes up a moment later; UCX skips a device that is down
    up=$(ip netns exec zr_h1 cat /sys/class/net/zr0/operstate)$(ip netns exec zr_h2 cat /sys/class/net/zr0/operstate)
    [ "$up" = upup ] && break
    sleep 0.1
done
cp /etc/hosts "$HOSTS_BACKUP"
printf '10.77.0.1 h1\n10.77.0.2 h2\n' >> /etc/hosts

# Hydra starts a remote proxy as `LAUNCHER <host> <command line>`, as it would call rsh:
# here, the command line runs in that host's namespaces, under that host's name.
cat > "$LAUNCHER" <<'EOF'
#!/usr/bin/env bash
host=$1; shift
exec ip netns exec "zr_$host" unshare --uts sh -c "hostname $host; $*"
EOF
chmod +x "$LAUNCHER"

# ---- 2. the job, across the two hosts and on one
JOB=(-m zero_ref.train --stage 3 --deterministic --steps 20 --batch-size 8 --quiet
     --sample-chars 0 --n-layer 2 --d-model 32)
export UCX_TLS=tcp UCX_NET_DEVICES=zr0 PYTHONUNBUFFERED=1
rx_tx() { ip netns exec zr_h1 sh -c 'cat /sys/class/net/zr0/statistics/rx_bytes /sys/class/net/zr0/statistics/tx_bytes' | paste -sd' '; }
read -r rx0 tx0 < <(rx_tx)
start=$(date +%s)
ip netns exec zr_h1 unshare --uts sh -c "hostname h1; exec '$MPIEXEC' -launcher rsh \
    -launcher-exec '$LAUNCHER' -hosts h1:2,h2:2 -n 4 '$PY' ${JOB[*]} \
    --export '$OUT/two_hosts.safetensors'" > "$OUT/two_hosts.txt" 2>&1 \
    || { echo "the two-host run failed: $OUT/two_hosts.txt" >&2; tail -20 "$OUT/two_hosts.txt" >&2; exit 1; }
two_host_s=$(( $(date +%s) - start ))
read -r rx1 tx1 < <(rx_tx)

# ---- 2b. a rank on h2 fails: does its message reach the user every time?
arrived=0
for i in $(seq "$FAULT_RUNS"); do
    ip netns exec zr_h1 unshare --uts sh -c "hostname h1; ZERO_REF_INJECT_FAULT=raise:rank=3:step=3 \
        exec '$MPIEXEC' -launcher rsh -launcher-exec '$LAUNCHER' -hosts h1:2,h2:2 -n 4 \
        '$PY' ${JOB[*]}" > "$OUT/fault_$i.txt" 2>&1 || true
    grep -q "rank 3 of 4 failed at step 3" "$OUT/fault_$i.txt" && arrived=$((arrived + 1))
done
unset UCX_TLS UCX_NET_DEVICES
"$MPIEXEC" -n 4 "$PY" "${JOB[@]}" --export "$OUT/one_host.safetensors" > "$OUT/one_host.txt" 2>&1

# ---- 3. the same bytes?
same=false
cmp -s "$OUT/two_hosts.safetensors" "$OUT/one_host.safetensors" && same=true
crossed=$(( (rx1 - rx0) + (tx1 - tx0) ))
echo "exports byte for byte equal: $same; bytes over the link (h1's zr0, both ways): $crossed; two-host run ${two_host_s} s; a failing rank's message arrived in $arrived of $FAULT_RUNS runs"
echo "{\"exports_equal\": $same, \"link_bytes\": $crossed, \"two_host_seconds\": $two_host_s, \"fault_messages_arrived\": $arrived, \"fault_runs\": $FAULT_RUNS, \"out\": \"$OUT\"}" | tee "$OUT/result.json"
$same && [ "$arrived" = "$FAULT_RUNS" ]
