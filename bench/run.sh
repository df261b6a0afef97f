#!/bin/sh
# Every figure of BENCHMARKS.md, on this machine, in one run: nsmd and the
# real rpc.statd / sm-notify side by side. As root, from the repository:
#   bench/run.sh            (about 10 minutes; results in bench/results/)
# NSMD_BENCH_QUICK=1 runs smaller counts. Traffic stays on loopback and in
# network namespaces the tools create and remove.
set -eu
cd "$(dirname "$0")/.."
make -s build
bin=$PWD/bin/nsmd
out=bench/results
mkdir -p "$out"
q=${NSMD_BENCH_QUICK:-}
n() { if [ -n "$q" ]; then echo "$2"; else echo "$1"; fi; }

machine() {
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "cpu: $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
	echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB; kernel $(uname -r); Debian $(cat /etc/debian_version)"
	echo "go: $(go version | cut -d' ' -f3)"
	dpkg-query -W -f='${Package} ${Version}\n' rpcbind nfs-common tshark 2>/dev/null || true
	echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/machine.txt"
machine

# A dev cluster of N nodes on its own ports, of build $2 (default this
# one); waits until a leader answers.
devpid=
start_dev() {
	"${2:-$bin}" dev --nodes "$1" --vip 127.0.0.140 --nsm-port 16620 --raft-port 17300 \
		--admin-port 18024 --gossip-port 17946 --log-level warn >"$out/dev-$1.log" 2>&1 &
	devpid=$!
	i=0
	until "$bin" status --admin 127.0.0.1:18024 --json 2>/dev/null | grep -q '"role": *"leader"\|"leader_id": *"node'; do
		i=$((i + 1)); [ "$i" -le 200 ] || { echo "dev cluster did not start" >&2; exit 1; }
		sleep 0.05
	done
}
stop_dev() { [ -z "$devpid" ] || { kill "$devpid"; wait "$devpid" 2>/dev/null || true; devpid=; }; }
trap stop_dev EXIT

mon() { # label base args...
	label=$1 base=$2; shift 2
	echo "== bench mon $label" >&2
	"$bin" bench mon --addr 127.0.0.140:16620 --mon-base "$base" --warmup 200 --json --plot "$out/mon-$label.svg" "$@" >"$out/mon-$label.json"
}

# 0. This build beside the previous release (e2e/previous-release), in the
# same minutes, alternated: the machine's figures move between days, the
# ratio does not. The same load generator (this build's) drives both.
make -s prev-release
prev=$PWD/out/nsmd-prev
if [ -x "$prev" ]; then
	rounds=$(n 3 2)
	this_mon= prev_mon= this_fo= prev_fo=
	round=1
	while [ "$round" -le "$rounds" ]; do
		for b in this prev; do
			exe=$bin m=$out/mon-beside-$b-$round.json f=$out/failover-beside-$b-$round.json
			if [ "$b" = this ]; then
				this_mon=$this_mon$m, this_fo=$this_fo$f,
			else
				exe=$prev prev_mon=$prev_mon$m, prev_fo=$prev_fo$f,
			fi
			start_dev 3 "$exe"
			mon "beside-$b-$round" "127.3$round.0.1" -c 64 -n "$(n 60000 10000)"
			stop_dev
			echo "== bench failover beside, $b $round" >&2
			"$exe" bench failover --runs "$(n 10 3)" --json >"$f"
		done
		round=$((round + 1))
	done
	{
		echo "previous release: $(sed -n 's/^commit //p' e2e/previous-release)"
		echo "SM_MON, 3 nodes, 64 connections:"
		"$bin" bench compare --kind mon --this "$this_mon" --prev "$prev_mon"
		echo "failover, dev cluster, kill of the leader:"
		"$bin" bench compare --kind failover --this "$this_fo" --prev "$prev_fo"
	} | tee "$out/beside-previous.txt" >&2
else
	echo "no previous release built (a shallow clone?): no same-run comparison" | tee "$out/beside-previous.txt" >&2
fi

# 1. SM_MON, committed on 3 nodes (fsync on), then on 1 node.
start_dev 3
mon 3n-tcp-c1 127.11.0.1 -c 1 -n "$(n 3000 500)"
mon 3n-tcp-c8 127.12.0.1 -c 8 -n "$(n 10000 2000)"
mon 3n-tcp-c64 127.13.0.1 -c 64 -n "$(n 60000 10000)"
mon 3n-tcp-c64-d4 127.14.0.1 -c 64 --depth 4 -n "$(n 100000 20000)"
mon 3n-udp-c64 127.15.0.1 --proto udp -c 64 -n "$(n 60000 10000)"
mon 3n-tcp-c8-unmon 127.16.0.1 -c 8 --unmon -n "$(n 10000 2000)"
stop_dev
start_dev 1
mon 1n-tcp-c1 127.21.0.1 -c 1 -n "$(n 5000 500)"
mon 1n-tcp-c64 127.22.0.1 -c 64 -n "$(n 60000 10000)"
stop_dev

# 2. The same load on the real rpc.statd (it fsyncs per host: fewer calls).
echo "== bench mon on rpc.statd" >&2
bench/statd-mon.sh "$bin" -c 1 -n "$(n 300 100)" --json --plot "$out/mon-statd-c1.svg" >"$out/mon-statd-c1.json"
bench/statd-mon.sh "$bin" -c 8 -n "$(n 300 100)" --json --plot "$out/mon-statd-c8.svg" >"$out/mon-statd-c8.json"

# 3. Notify fan-out after a takeover, and sm-notify on the same hosts.
echo "== bench notify" >&2
"$bin" bench notify --hosts 1000 --sm-notify --json --plot "$out/notify-1000.svg" >"$out/notify-1000.json"
"$bin" bench notify --hosts "$(n 10000 2000)" --json --plot "$out/notify-10000.svg" >"$out/notify-10000.json"
"$bin" bench notify --hosts "$(n 10000 2000)" --dead-pct 10 --json --plot "$out/notify-10000-dead10.svg" >"$out/notify-10000-dead10.json"
"$bin" bench notify --hosts "$(n 9000 1800)" --json >"$out/notify-9000.json"

# 4. Failover: dev cluster (loopback VIP), and the netlink VIP between
# namespaces (the e2e cluster; SIGKILL of the leader's process).
echo "== bench failover" >&2
"$bin" bench failover --runs "$(n 20 5)" --json --plot "$out/failover-dev.svg" >"$out/failover-dev.json"
NSMD_BIN=$bin NSMD_E2E_KILL_RUNS=$(n 20 5) go test -count=1 -run 'TestClusterFaultSchedules/1-sigkill' -v ./e2e/ 2>&1 |
	grep -E 'failover times|VIP watcher|^(ok|FAIL|---)' >"$out/failover-netlink.txt"

# 5. One million registrations on a 3-node cluster (followers in their own processes).
echo "== scale" >&2
NSMD_MEASURE=1 NSMD_MEASURE_REGS=$(n 1000000 100000) go test -count=1 -run TestMeasureScale1M -v ./cluster/ 2>&1 |
	grep -vE 'level=(DEBUG|INFO|WARN)' >"$out/scale-1m.txt"

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/machine.txt"
echo "results in $out/" >&2
