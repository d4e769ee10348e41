# Two hosts on one Linux machine, as a library to source (root needed):
#
#   source scripts/bench/netns_hosts.sh
#   trap 'nh_cleanup zrp' EXIT          # the caller owns the trap: everything is removed
#   nh_make zrp 10.79.0                 # namespaces zrp_h1, zrp_h2; hosts zrph1, zrph2
#   nh_rate zrp 200mbit                 # tbf on both ends of the link (nh_rate zrp off)
#   read -r rx tx < <(nh_bytes zrp)     # h1's byte counters on the link
#   nh_mpiexec zrp zrph1:2,zrph2:2 -n 4 python scripts/x.py   # mpiexec across both
#   nh_cleanup zrp
#   nh_make3 zrp 10.79.0                # three hosts zrph1..zrph3 on one switch instead
#
# Every function takes the prefix first and keeps no shell state, so a Python script can
# call each one through `bash -c 'source scripts/bench/netns_hosts.sh; nh_rate zrp 100mbit'`.
# Names made from prefix P: namespaces P_h1 and P_h2, joined by a veth pair named P0 on
# both sides (SUBNET.1 in h1, SUBNET.2 in h2), host names Ph1 and Ph2 (each process run
# by nh_exec or nh_mpiexec gets its own UTS namespace with that name), the names in
# /etc/netns/P_hN/hosts (ip netns exec mounts that file over /etc/hosts inside, so the
# machine's /etc/hosts is never edited), and Hydra's launcher /tmp/P_netns_rsh.
# The recipe is scripts/tools/two_host_check.sh's. UCX is forced onto TCP over P0
# (UCX_TLS=tcp, UCX_NET_DEVICES=P0), so ranks on different hosts really use the link;
# ranks on the same host still use shared memory. tbf works on this kernel; netem does not.

nh_available() {  # 0 if namespaces can be made here, else prints why and returns 1
    if [ "$(id -u)" != 0 ]; then echo "netns_hosts: needs root (network namespaces)"; return 1; fi
    for tool in ip tc unshare; do
        command -v "$tool" >/dev/null || { echo "netns_hosts: no '$tool' on PATH"; return 1; }
    done
    local probe="nhprobe_$$"
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "netns_hosts: 'ip netns add' failed (no CAP_SYS_ADMIN, or no netns support)"
        return 1
    fi
    ip netns del "$probe"
}

nh_make() {  # nh_make PREFIX SUBNET(a.b.c): two hosts joined by a veth pair, links up
    local p=$1 net=$2
    [ -n "$p" ] && [ -n "$net" ] || { echo "usage: nh_make PREFIX a.b.c" >&2; return 2; }
    nh_cleanup "$p"  # leftovers of an interrupted earlier run
    ip netns add "${p}_h1" && ip netns add "${p}_h2" || return 1
    ip link add "${p}0" netns "${p}_h1" type veth peer name "${p}0" netns "${p}_h2" || return 1
    ip -n "${p}_h1" addr add "$net.1/24" dev "${p}0"
    ip -n "${p}_h2" addr add "$net.2/24" dev "${p}0"
    local ns
    for ns in "${p}_h1" "${p}_h2"; do
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "${p}0" up
        mkdir -p "/etc/netns/$ns"
        { cat /etc/hosts; printf '%s.1 %sh1\n%s.2 %sh2\n' "$net" "$p" "$net" "$p"; } \
            > "/etc/netns/$ns/hosts"
    done
    local _ up
    for _ in $(seq 50); do  # a veth comes up a moment later; UCX skips a device that is down
        up=$(nh_exec "$p" 1 cat "/sys/class/net/${p}0/operstate")
        up=$up$(nh_exec "$p" 2 cat "/sys/class/net/${p}0/operstate")
        [ "$up" = upup ] && break
        sleep 0.1
    done
    [ "$up" = upup ] || { echo "netns_hosts: ${p}0 did not come up ($up)" >&2; return 1; }
    _nh_launcher "$p"
}

_nh_launcher() {  # _nh_launcher PREFIX: write Hydra's launcher /tmp/PREFIX_netns_rsh
    local p=$1
    # Hydra starts a remote proxy as `LAUNCHER <host> <command line>`, as it would call
    # rsh: here the command line runs in that host's namespaces, under that host's name.
    cat > "/tmp/${p}_netns_rsh" <<EOF
#!/usr/bin/env bash
host=\$1; shift
exec ip netns exec "${p}_\${host#${p}}" unshare --uts sh -c "hostname \$host; \$*"
EOF
    chmod +x "/tmp/${p}_netns_rsh"
}

nh_make3() {  # nh_make3 PREFIX SUBNET(a.b.c): three hosts, each with one link to a switch
    # (a bridge in namespace PREFIX_sw): host n is SUBNET.n, named PREFIXhn, its end of the
    # link named PREFIX0 as nh_make's are, so nh_exec, nh_mpiexec and UCX_NET_DEVICES work
    # unchanged. nh_rate and nh_bytes act on the first two hosts' links.
    local p=$1 net=$2 n m
    [ -n "$p" ] && [ -n "$net" ] || { echo "usage: nh_make3 PREFIX a.b.c" >&2; return 2; }
    nh_cleanup "$p"
    ip netns add "${p}_sw" || return 1
    ip -n "${p}_sw" link add "${p}br" type bridge || return 1
    ip -n "${p}_sw" link set "${p}br" up
    for n in 1 2 3; do
        ip netns add "${p}_h$n" || return 1
        ip link add "${p}0" netns "${p}_h$n" type veth peer name "${p}p$n" netns "${p}_sw" \
            || return 1
        ip -n "${p}_sw" link set "${p}p$n" master "${p}br"
        ip -n "${p}_sw" link set "${p}p$n" up
        ip -n "${p}_h$n" addr add "$net.$n/24" dev "${p}0"
        ip -n "${p}_h$n" link set lo up
        ip -n "${p}_h$n" link set "${p}0" up
        mkdir -p "/etc/netns/${p}_h$n"
        { cat /etc/hosts; for m in 1 2 3; do printf '%s.%s %sh%s\n' "$net" "$m" "$p" "$m"; done; } \
            > "/etc/netns/${p}_h$n/hosts"
    done
    local _ up
    for _ in $(seq 50); do
        up=""
        for n in 1 2 3; do up=$up$(nh_exec "$p" "$n" cat "/sys/class/net/${p}0/operstate"); done
        [ "$up" = upupup ] && break
        sleep 0.1
    done
    [ "$up" = upupup ] || { echo "netns_hosts: ${p}0 did not come up ($up)" >&2; return 1; }
    _nh_launcher "$p"
}

nh_exec() {  # nh_exec PREFIX 1|2|3 CMD...: run CMD on host n, under its host name
    local p=$1 n=$2
    shift 2
    ip netns exec "${p}_h$n" unshare --uts sh -c 'hostname "$0"; exec "$@"' "${p}h$n" "$@"
}

nh_rate() {  # nh_rate PREFIX RATE [BURST [LATENCY]]: tbf on both ends; RATE off removes it
    local p=$1 rate=$2 burst=${3:-64kb} latency=${4:-50ms} ns
    for ns in "${p}_h1" "${p}_h2"; do
        if [ "$rate" = off ]; then
            ip netns exec "$ns" tc qdisc del dev "${p}0" root 2>/dev/null || true
        else
            ip netns exec "$ns" tc qdisc replace dev "${p}0" root tbf \
                rate "$rate" burst "$burst" latency "$latency" || return 1
        fi
    done
}

nh_bytes() {  # nh_bytes PREFIX: "rx_bytes tx_bytes" of h1's end of the link
    local p=$1
    ip netns exec "${p}_h1" cat "/sys/class/net/${p}0/statistics/rx_bytes" \
        "/sys/class/net/${p}0/statistics/tx_bytes" | paste -sd' '
}

nh_mpiexec() {  # nh_mpiexec PREFIX HOSTS MPIEXEC_ARGS...: mpiexec in h1 across both hosts
    # HOSTS as Hydra takes it, e.g. Ph1:2,Ph2:2. MPIEXEC: the one beside $PYTHON (or on
    # PATH). The environment (UCX's variables set here) reaches every rank on both hosts.
    local p=$1 hosts=$2
    shift 2
    local py=${PYTHON:-$(command -v python)}
    local mpiexec
    mpiexec=$(dirname "$py")/mpiexec
    [ -x "$mpiexec" ] || mpiexec=$(command -v mpiexec)
    UCX_TLS=tcp UCX_NET_DEVICES="${p}0" nh_exec "$p" 1 "$mpiexec" -launcher rsh \
        -launcher-exec "/tmp/${p}_netns_rsh" -hosts "$hosts" "$@"
}

nh_cleanup() {  # nh_cleanup PREFIX: remove everything nh_make made (safe to repeat)
    local p=$1 ns
    for ns in "${p}_h1" "${p}_h2" "${p}_h3" "${p}_sw"; do
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    rm -f "/tmp/${p}_netns_rsh"
}
