package cluster

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	batchSize         prometheus.Histogram
	applyLatency      prometheus.Histogram
	takeovers         prometheus.Counter
	takeoverSeconds   prometheus.Histogram
	failoverSeconds   prometheus.Histogram
	diskWrite         *prometheus.HistogramVec
	leaderChanges     prometheus.Counter
	forwarded         *prometheus.CounterVec
	witnessHandoffs   *prometheus.CounterVec
	diskWriteErrors   prometheus.Counter
	diskSlowHandoffs  prometheus.Counter
	watchdogArmed     prometheus.Gauge
	watchdogFeeds     prometheus.Counter
	watchdogLateFeeds prometheus.Counter
	fenceWaits        *prometheus.CounterVec
	fenceWaitSeconds  prometheus.Histogram
	fenceAgentRuns    *prometheus.CounterVec
	failedTakeovers   prometheus.Counter
	ownerLowered      prometheus.Counter
	monLowered        prometheus.Counter
	transfers         *prometheus.CounterVec
	transferDeclined  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, n *Node) (*metrics, error) {
	m := &metrics{
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nsmd_commit_batch_size", Help: "Commands per raft log entry (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		applyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nsmd_apply_duration_seconds", Help: "Time from raft.Apply to commit and FSM apply of one entry.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_takeovers_total", Help: "Takeovers committed by this node (sm_state raised, grace opened).",
		}),
		takeoverSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nsmd_takeover_duration_seconds", Help: "From leadership gained to the notifier started.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		failoverSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nsmd_failover_duration_seconds",
			Help:    "From this node's last contact with the previous leader to it serving as the new leader (takeover committed, VIP held, on_leader hook done). Not observed on a first election (no previous leader known).",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 15, 30, 60, 120},
		}),
		diskWrite: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nsmd_disk_write_duration_seconds",
			Help:    "Writes to the data directory, fsync included, by op: raft_log (a raft log store commit), raft_stable (term/vote), probe (the disk probe's 64 KiB write and fsync).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"op"}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_leader_changes_total", Help: "Leadership changes observed by this node.",
		}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_forwarded_writes_total", Help: "Writes forwarded to the leader (ok, denied) or served for followers (served).",
		}, []string{"result"}),
		diskWriteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_disk_write_errors_total", Help: "Failed writes to the raft log or stable store, and failed disk probes, in the data directory.",
		}),
		diskSlowHandoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_disk_slow_handoffs_total", Help: "Leadership handed to another node because this node's data directory was slow.",
		}),
		watchdogArmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nsmd_fence_watchdog_armed", Help: "1 while this node's watchdog is armed (it serves, or its stop failed and the watchdog resets it).",
		}),
		watchdogFeeds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_fence_watchdog_feeds_total", Help: "Watchdog pings by this node, each with proof that it may serve (raft leadership confirmed by a quorum within the lease).",
		}),
		watchdogLateFeeds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_fence_watchdog_late_feeds_total", Help: "Watchdog pings that returned after the proof they were sent with had ended (a slow driver, a stalled process): the watchdog was starved at once towards that proof's end + fence_timeout.",
		}),
		fenceWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_fence_waits_total", Help: "Other serving nodes proven stopped before this node served, by how: clean (it said so), agent (the fence agent reported it off), watchdog (its watchdog must have reset it).",
		}, []string{"by"}),
		fenceWaitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nsmd_fence_wait_seconds", Help: "How long a new leader waited for every other serving node to be proven stopped before it served.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 5, 10, 15, 30, 60, 120},
		}),
		fenceAgentRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_fence_agent_runs_total", Help: "Fence agent runs against other nodes, by result (ok, failed).",
		}, []string{"result"}),
		failedTakeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_failed_takeovers_total", Help: "Takeovers whose on_leader hook failed: this node stopped again, notified nobody and handed leadership on.",
		}),
		ownerLowered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_unmon_owner_checked_by_proposer_total",
			Help: "SM_UNMON and SM_UNMON_ALL committed as owner-less removals of the registrations the caller made, checked on the proposing node's state, because not every member applies the owner-checked commands yet (a rolling upgrade, a member down).",
		}),
		monLowered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_mon_owner_checked_by_proposer_total",
			Help: "SM_MON checked on the proposing node's state (may it replace the registration it names?) and committed unguarded, because not every member applies the guarded registration yet (a rolling upgrade, a member down).",
		}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_leadership_transfers_total", Help: "Leadership transfers this node started, by reason (slow_disk, disk_unwritable, witness, failed_takeover, operator, shutdown) and result (ok, failed).",
		}, []string{"reason", "result"}),
		transferDeclined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_leadership_transfers_declined_total", Help: "Times this node had a reason to hand leadership away and no other node was healthier, so it kept leading (slow_disk: once per slow episode).",
		}, []string{"reason"}),
		witnessHandoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_witness_handoffs_total", Help: "Leadership hand-offs by this witness after it won an election (ok, failed).",
		}, []string{"result"}),
	}
	for _, r := range moveReasons {
		m.transfers.WithLabelValues(r.String(), "ok")
		m.transfers.WithLabelValues(r.String(), "failed")
		m.transferDeclined.WithLabelValues(r.String())
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	cs := []prometheus.Collector{
		m.batchSize, m.applyLatency, m.takeovers, m.takeoverSeconds, m.failoverSeconds, m.diskWrite,
		m.leaderChanges, m.forwarded, m.witnessHandoffs, m.diskWriteErrors, m.diskSlowHandoffs, m.ownerLowered, m.monLowered,
		m.transfers, m.transferDeclined,
		m.watchdogArmed, m.watchdogFeeds, m.watchdogLateFeeds, m.fenceWaits, m.fenceWaitSeconds, m.fenceAgentRuns, m.failedTakeovers,
		gauge("nsmd_fence_serving", "1 while this node serves the storage (from before its on_leader hook until its on_follower hook succeeded).", func() float64 {
			if n.serving.Load() {
				return 1
			}
			return 0
		}),
		gauge("nsmd_disk_writable", "1 while the data directory takes writes; 0 while it does not and this node stays out of elections.", func() float64 {
			if n.disk == nil || n.disk.writable() {
				return 1
			}
			return 0
		}),
		gauge("nsmd_disk_slow", "1 while the data directory's writes are slow (median over 2 s above disk_slow_threshold) and this node stays out of leadership.", func() float64 {
			if n.disk != nil && n.disk.Status().Slow {
				return 1
			}
			return 0
		}),
		gauge("nsmd_is_leader", "1 when this node is the raft leader.", func() float64 {
			if n.raft != nil && n.raft.State() == raft.Leader {
				return 1
			}
			return 0
		}),
		gauge("nsmd_ready", "1 while this node knows the current sm_state and answers NSM calls (what /readyz checks).", func() float64 {
			if n.raft != nil && n.Ready() {
				return 1
			}
			return 0
		}),
		gauge("nsmd_raft_term", "Current raft term.", func() float64 {
			if n.raft == nil {
				return 0
			}
			var t uint64
			fmt.Sscan(n.raft.Stats()["term"], &t)
			return float64(t)
		}),
		gauge("nsmd_sm_state", "Current sm_state.", func() float64 { return float64(n.fsm.State()) }),
		gauge("nsmd_registrations", "Monitored-host registrations.", func() float64 { return float64(n.fsm.Len()) }),
		gauge("nsmd_applied_index", "Last raft index applied to the FSM.", func() float64 { return float64(n.fsm.AppliedIndex()) }),
		gauge("nsmd_grace_active", "1 while the NLM grace window opened by the last takeover is open.", func() float64 {
			if time.Now().Before(n.fsm.GraceUntil()) {
				return 1
			}
			return 0
		}),
		gauge("nsmd_grace_remaining_seconds", "Seconds left in the NLM grace window.", func() float64 {
			if d := time.Until(n.fsm.GraceUntil()); d > 0 {
				return d.Seconds()
			}
			return 0
		}),
	}
	cs = append(cs, promiseMetrics(n)...)
	for _, op := range []string{"raft_log", "raft_stable", "probe"} {
		m.diskWrite.WithLabelValues(op)
	}
	if n.cfg.VIP != nil { // every VIP mode; a witness has none
		cs = append(cs, gauge("nsmd_vip_held", "1 while this node holds the VIP (for vip_mode netlink: acquired and present on the interface).", func() float64 {
			if n.VIPHeld() {
				return 1
			}
			return 0
		}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	return m, nil
}
