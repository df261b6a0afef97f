#!/bin/sh
# The real rpc.statd under `nsmd bench mon`, on this machine, touching nothing
# outside a network namespace of its own: rpcbind + rpc.statd on a fresh
# state directory, then `nsmd bench mon --addr 127.0.0.1 ARGS...` (port from
# rpcbind). As root:  bench/statd-mon.sh NSMD_BIN -c 1 -n 300 --json
set -eu
if [ "${NSMD_STATD_INNER:-}" != 1 ]; then
	ns="nsmd-statdbench-$$"
	ip netns add "$ns"
	trap 'ip netns del "$ns"' EXIT
	ip -n "$ns" link set lo up
	NSMD_STATD_INNER=1 ip netns exec "$ns" unshare --mount --propagation private sh "$0" "$@"
	exit $?
fi
bin=$1; shift
mount -t tmpfs nsmd-statdbench /run
mkdir -p /run/rpcbind
dir=$(mktemp -d)
mkdir "$dir/sm" "$dir/sm.bak"
rpcbind -f -w & rpcb=$!
rpc.statd -F -L -P "$dir" >"$dir/statd.log" 2>&1 & statd=$!
stop() { kill "$statd" "$rpcb" 2>/dev/null || true; wait "$statd" "$rpcb" 2>/dev/null || true; rm -rf "$dir"; }
trap stop EXIT
i=0
until rpcinfo -T tcp 127.0.0.1 100024 1 >/dev/null 2>&1; do
	i=$((i + 1)); [ "$i" -le 100 ] || { echo "rpc.statd did not register" >&2; exit 1; }
	sleep 0.05
done
"$bin" bench mon --addr 127.0.0.1 "$@"
echo "statd-mon: records in sm/: $(ls "$dir/sm" | wc -l)" >&2
