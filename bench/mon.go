package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nsmd/nsmd/bench/drill"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// The lock manager bench mon registers as: Linux lockd's my_id (PEERS.md).
const (
	benchMyProg = 100021
	benchMyVers = 3
	benchMyProc = 16
)

type MonOptions struct {
	Addr     string // host:port (see Target)
	Net      string // "tcp" | "udp"
	Conns    int
	Depth    int           // outstanding calls per connection
	Calls    int           // measured calls; 0: run for Duration
	Duration time.Duration // measured time when Calls is 0
	Warmup   int           // calls made (same mix) before measuring
	Unmon    bool          // every other call of a caller is SM_UNMON of a name it monitored
	MonBase  netip.Addr    // first mon_name; names count up and stay in 127/8
	MyName   string
	// Privileged binds source ports below 1024 (as kernel lockd does);
	// where that is not allowed the run falls back to ordinary ports and
	// the report says so.
	Privileged bool
	Source     netip.Addr // optional source address
	Timeout    time.Duration
	Retransmit time.Duration // UDP

	Progress io.Writer // one line per second; nil: none
	TTY      bool
}

// Error kinds, in report order.
const (
	benchStatFail     = iota // SM_MON answered stat_fail (refused)
	benchTimeout             // no reply within --timeout
	benchProgUnavail         // accepted-reply statuses and rejections
	benchProgMismatch        //
	benchProcUnavail         //
	benchGarbageArgs         //
	benchSystemErr           //
	benchAuth                //
	benchConn                // connection lost, refused, undecodable reply
	benchErrKinds
)

func benchErrNames() [benchErrKinds]string {
	return [benchErrKinds]string{"stat_fail", "timeout", "prog_unavail", "prog_mismatch", "proc_unavail", "garbage_args", "system_err", "auth_error", "connection"}
}

// benchErrKind sorts a failed call.
func benchErrKind(err error) int {
	switch {
	case errors.Is(err, oncrpc.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return benchTimeout
	case errors.Is(err, oncrpc.ErrProgUnavail):
		return benchProgUnavail
	case errors.Is(err, oncrpc.ErrProgMismatch), errors.Is(err, oncrpc.ErrRPCMismatch):
		return benchProgMismatch
	case errors.Is(err, oncrpc.ErrProcUnavail):
		return benchProcUnavail
	case errors.Is(err, oncrpc.ErrGarbageArgs):
		return benchGarbageArgs
	case errors.Is(err, oncrpc.ErrSystemErr):
		return benchSystemErr
	case errors.Is(err, oncrpc.ErrAuth):
		return benchAuth
	}
	return benchConn
}

// Procedures measured: index into per-proc arrays.
const (
	benchMon = iota
	benchUnmon
	benchProcs
)

func benchProcNames() [benchProcs]string { return [benchProcs]string{"SM_MON", "SM_UNMON"} }

// Latency summarises latencies in milliseconds (nearest rank).
type Latency struct {
	N      int     `json:"n"`
	MinMS  float64 `json:"min_ms"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	P999MS float64 `json:"p999_ms"`
	MaxMS  float64 `json:"max_ms"`
}

type ProcStats struct {
	Proc     string         `json:"proc"`
	Calls    int            `json:"calls"`
	OK       int            `json:"ok"`
	Errors   map[string]int `json:"errors,omitempty"`
	PerSec   float64        `json:"ok_per_s"`
	Latency  Latency        `json:"latency"`
	sortedMS []float64
}

// Bucket is one bar of the latency histogram: calls that took more
// than FromMS and at most ToMS (log buckets, 10 per decade).
type Bucket struct {
	FromMS float64 `json:"from_ms"`
	ToMS   float64 `json:"to_ms"`
	Count  int     `json:"count"`
}

type MonReport struct {
	Date       time.Time `json:"date"`
	Target     string    `json:"target"`
	PortFrom   string    `json:"port_from"` // "given" | "portmapper"
	Proto      string    `json:"proto"`
	Conns      int       `json:"conns"`
	Depth      int       `json:"depth"`
	Unmon      bool      `json:"unmon"`
	MonFirst   string    `json:"mon_name_first"`
	MonLast    string    `json:"mon_name_last,omitempty"`
	MyName     string    `json:"my_name"`
	Privileged bool      `json:"privileged_source_port"`
	Source     string    `json:"source,omitempty"` // the first connection's local address
	Warmup     int       `json:"warmup_calls"`
	WarmupErrs int       `json:"warmup_errors"`
	Asked      int       `json:"calls_asked,omitempty"`
	AskedS     float64   `json:"duration_asked_s,omitempty"`

	Calls    int               `json:"calls"`
	OK       int               `json:"ok"`
	Failed   int               `json:"failed"`
	Errors   map[string]int    `json:"errors"`                  // kind → count, every kind listed
	Samples  map[string]string `json:"error_samples,omitempty"` // kind → first error seen
	ElapsedS float64           `json:"elapsed_s"`
	CallsPS  float64           `json:"calls_per_s"`
	OKPS     float64           `json:"ok_per_s"`
	Latency  Latency           `json:"latency"` // every call that got an answer (ok or stat_fail)
	Procs    []ProcStats       `json:"procs"`
	Hist     []Bucket          `json:"histogram"`
	Stopped  string            `json:"stopped,omitempty"` // why the run ended early

	sortedMS []float64
}

// benchWorker is one caller: its own counters and latencies, merged after
// the run, so the hot path shares nothing but the call counter.
type benchWorker struct {
	c      *oncrpc.Client
	step   int
	queue  []string // names this caller monitored and has not unmonitored
	lat    [benchProcs][]int64
	calls  [benchProcs]int
	ok     [benchProcs]int
	errs   [benchProcs][benchErrKinds]int
	sample [benchErrKinds]string
}

// benchMonRun is one bench mon in progress.
type benchMonRun struct {
	o       MonOptions
	clients []*oncrpc.Client
	base    uint32 // MonBase as a number
	space   uint32 // names available from base to 127.255.255.255
	names   atomic.Uint32
	claimed atomic.Int64 // calls started in this phase
	done    atomic.Int64 // calls finished in this phase
	failed  atomic.Int64
	my      nsm.MyID
}

func (o *MonOptions) check() error {
	switch o.Net {
	case "tcp", "udp":
	default:
		return fmt.Errorf("--proto %q: want tcp or udp", o.Net)
	}
	if o.Conns < 1 || o.Depth < 1 {
		return fmt.Errorf("-c %d --depth %d: both must be at least 1", o.Conns, o.Depth)
	}
	if o.Calls < 0 || o.Warmup < 0 {
		return errors.New("-n and --warmup must not be negative")
	}
	if o.Calls == 0 && o.Duration <= 0 {
		return errors.New("give -n CALLS or --duration")
	}
	if !o.MonBase.Is4() || o.MonBase.As4()[0] != 127 {
		return fmt.Errorf("--mon-base %s: must be an IPv4 address in 127.0.0.0/8 (the server may SM_NOTIFY these names)", o.MonBase)
	}
	if o.Calls > 0 {
		b := o.MonBase.As4()
		space := 1<<24 - (int(b[1])<<16 | int(b[2])<<8 | int(b[3]))
		if o.Calls+o.Warmup > space {
			return fmt.Errorf("%d calls from --mon-base %s would leave 127.0.0.0/8", o.Calls+o.Warmup, o.MonBase)
		}
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	return nil
}

// RunMon dials the connections, makes the warmup calls, then the
// measured ones, and summarises them. An error means the run could not
// start (bad options, no server); failed calls are counted in the report.
func RunMon(ctx context.Context, o MonOptions) (*MonReport, error) {
	if err := o.check(); err != nil {
		return nil, fmt.Errorf("bench mon: %w", err)
	}
	b4 := o.MonBase.As4()
	b := &benchMonRun{o: o, base: binary.BigEndian.Uint32(b4[:]),
		my: nsm.MyID{MyName: o.MyName, Prog: benchMyProg, Vers: benchMyVers, Proc: benchMyProc}}
	b.space = 0x7fffffff - b.base + 1
	rep := &MonReport{Date: time.Now().UTC(), Target: o.Addr, Proto: o.Net, Conns: o.Conns, Depth: o.Depth,
		Unmon: o.Unmon, MonFirst: o.MonBase.String(), MyName: o.MyName, Warmup: o.Warmup, Asked: o.Calls}
	if o.Calls == 0 {
		rep.AskedS = o.Duration.Seconds()
	}
	privileged, err := b.dial(ctx)
	defer func() {
		for _, c := range b.clients {
			c.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	rep.Privileged = privileged
	if la := b.clients[0].LocalAddr(); la.IsValid() {
		rep.Source = la.String()
	}
	if o.Warmup > 0 {
		ws, _, _ := b.phase(ctx, o.Warmup, 0, "warmup")
		for _, w := range ws {
			for p := range benchProcs {
				for _, n := range w.errs[p] {
					rep.WarmupErrs += n
				}
			}
		}
	}
	workers, elapsed, stopped := b.phase(ctx, o.Calls, o.Duration, "")
	rep.Stopped = stopped
	if n := b.names.Load(); n > 0 {
		rep.MonLast = benchName(b.base + n - 1)
	}
	rep.summarise(workers, elapsed)
	return rep, nil
}

// dial opens o.Conns clients, from privileged ports if asked and allowed.
func (b *benchMonRun) dial(ctx context.Context) (privileged bool, err error) {
	privileged = b.o.Privileged
	for range b.o.Conns {
		cfg := oncrpc.ClientConfig{Net: b.o.Net, Addr: b.o.Addr, Timeout: b.o.Timeout, Retransmit: b.o.Retransmit,
			LocalAddr: b.o.Source, Privileged: privileged}
		c, err := oncrpc.Dial(ctx, cfg)
		if err != nil && privileged && (errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)) {
			privileged, cfg.Privileged = false, false
			c, err = oncrpc.Dial(ctx, cfg)
		}
		if err != nil {
			return privileged, fmt.Errorf("bench mon: connection %d of %d: %w", len(b.clients)+1, b.o.Conns, err)
		}
		b.clients = append(b.clients, c)
	}
	// A connect proves little (UDP: nothing): check the program answers.
	if err := b.clients[0].Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcNull, oncrpc.Void{}, nil); err != nil {
		return privileged, fmt.Errorf("bench mon: NSM NULL on %s: %w", b.o.Addr, err)
	}
	return privileged, nil
}

// benchName is the dotted form of a 127/8 address number.
func benchName(n uint32) string {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], n)
	return netip.AddrFrom4(a).String()
}

// name hands out the next distinct mon_name; false once 127/8 is used up.
func (b *benchMonRun) name() (string, bool) {
	n := b.names.Add(1)
	if n > b.space {
		return "", false
	}
	return benchName(b.base + n - 1), true
}

// phase runs calls calls (or, with calls 0, for d) on conns × depth
// callers and returns them with the elapsed time.
func (b *benchMonRun) phase(ctx context.Context, calls int, d time.Duration, label string) ([]*benchWorker, time.Duration, string) {
	b.claimed.Store(0)
	b.done.Store(0)
	b.failed.Store(0)
	workers := make([]*benchWorker, b.o.Conns*b.o.Depth)
	per := 16
	if calls > 0 {
		per = calls/len(workers) + 1
	}
	for i := range workers {
		w := &benchWorker{c: b.clients[i/b.o.Depth]}
		for p := range benchProcs {
			w.lat[p] = make([]int64, 0, per)
		}
		workers[i] = w
	}
	var exhausted atomic.Bool
	start := time.Now()
	until := start.Add(d)
	stopProgress := b.progress(start, calls, d, label)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !b.work(ctx, w, calls, until) {
				exhausted.Store(true)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	switch {
	case exhausted.Load():
		return workers, elapsed, "mon_name space exhausted (127.255.255.255 reached)"
	case ctx.Err() != nil:
		return workers, elapsed, "interrupted"
	}
	return workers, elapsed, ""
}

// work is one caller's loop; false when it ran out of mon_names.
func (b *benchMonRun) work(ctx context.Context, w *benchWorker, calls int, until time.Time) bool {
	var mon nsm.Mon
	mon.ID.My = b.my
	var id nsm.MonID
	id.My = b.my
	for ctx.Err() == nil {
		if calls > 0 {
			if b.claimed.Add(1) > int64(calls) {
				return true
			}
		} else if !time.Now().Before(until) {
			return true
		}
		unmon := b.o.Unmon && w.step%2 == 1 && len(w.queue) > 0
		w.step++
		var (
			err  error
			proc = benchMon
			res  nsm.SMStatRes
			t0   time.Time
		)
		if unmon {
			proc = benchUnmon
			id.MonName = w.queue[0]
			w.queue = w.queue[1:]
			var st nsm.SMStat
			t0 = time.Now()
			err = w.c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcUnmon, &id, &st)
		} else {
			name, ok := b.name()
			if !ok {
				return false
			}
			mon.ID.MonName = name
			binary.LittleEndian.PutUint64(mon.Priv[:8], rand.Uint64())
			binary.LittleEndian.PutUint64(mon.Priv[8:], rand.Uint64())
			t0 = time.Now()
			err = w.c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res)
		}
		took := time.Since(t0)
		if err != nil && ctx.Err() != nil {
			return true // interrupted: not the server's failure
		}
		w.calls[proc]++
		b.done.Add(1)
		switch {
		case err != nil:
			k := benchErrKind(err)
			w.errs[proc][k]++
			if w.sample[k] == "" {
				w.sample[k] = err.Error()
			}
			b.failed.Add(1)
			continue // no latency: a timeout's would only echo --timeout
		case proc == benchMon && res.Res != nsm.StatSucc:
			w.errs[proc][benchStatFail]++
			if w.sample[benchStatFail] == "" {
				w.sample[benchStatFail] = fmt.Sprintf("SM_MON %s: %s state=%d", mon.ID.MonName, res.Res, res.State)
			}
			b.failed.Add(1)
		case proc == benchMon:
			w.ok[proc]++
			w.queue = append(w.queue, mon.ID.MonName)
		default:
			w.ok[proc]++
		}
		w.lat[proc] = append(w.lat[proc], int64(took))
	}
	return true
}

// progress prints a line a second until the returned stop is called.
func (b *benchMonRun) progress(start time.Time, calls int, d time.Duration, label string) (stop func()) {
	if b.o.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last, lastAt := int64(0), start
		for {
			select {
			case <-quit:
				if b.o.TTY {
					fmt.Fprint(b.o.Progress, "\r\033[K")
				}
				return
			case now := <-t.C:
				n := b.done.Load()
				rate := float64(n-last) / now.Sub(lastAt).Seconds()
				last, lastAt = n, now
				of := fmt.Sprintf("of %s", d)
				if calls > 0 {
					of = fmt.Sprintf("%d of %d calls", n, calls)
				}
				line := fmt.Sprintf("%s%5.0fs  %s  %.0f/s  failed %d", label, now.Sub(start).Seconds(), of, rate, b.failed.Load())
				if b.o.TTY {
					fmt.Fprint(b.o.Progress, "\r\033[K"+line)
				} else {
					fmt.Fprintln(b.o.Progress, line)
				}
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}

// latencySummary summarises ascending millisecond latencies.
func latencySummary(sorted []float64) Latency {
	l := Latency{N: len(sorted)}
	if len(sorted) == 0 {
		return l
	}
	sum := 0.0
	for _, v := range sorted {
		sum += v
	}
	l.MinMS, l.MeanMS, l.MaxMS = sorted[0], sum/float64(len(sorted)), sorted[len(sorted)-1]
	l.P50MS, l.P90MS = drill.Percentile(sorted, 0.5), drill.Percentile(sorted, 0.9)
	l.P99MS, l.P999MS = drill.Percentile(sorted, 0.99), drill.Percentile(sorted, 0.999)
	return l
}

// benchHistogram buckets ascending latencies (ms) 10 to a decade.
func benchHistogram(sorted []float64) []Bucket {
	var out []Bucket
	for _, v := range sorted {
		k := math.Ceil(10*math.Log10(max(v, 1e-6)) - 1e-9)
		to := math.Pow(10, k/10)
		if len(out) == 0 || out[len(out)-1].ToMS != to {
			out = append(out, Bucket{FromMS: math.Pow(10, (k-1)/10), ToMS: to})
		}
		out[len(out)-1].Count++
	}
	return out
}

// summarise merges the workers into the report.
func (rep *MonReport) summarise(workers []*benchWorker, elapsed time.Duration) {
	rep.ElapsedS = elapsed.Seconds()
	rep.Errors = map[string]int{}
	names := benchErrNames()
	for _, n := range names {
		rep.Errors[n] = 0
	}
	for p, pname := range benchProcNames() {
		ps := ProcStats{Proc: pname, Errors: map[string]int{}}
		for _, w := range workers {
			ps.Calls += w.calls[p]
			ps.OK += w.ok[p]
			for k, n := range w.errs[p] {
				if n > 0 {
					ps.Errors[names[k]] += n
					rep.Errors[names[k]] += n
				}
			}
			for _, ns := range w.lat[p] {
				ps.sortedMS = append(ps.sortedMS, float64(ns)/1e6)
			}
		}
		if ps.Calls == 0 && p != benchMon {
			continue
		}
		slices.Sort(ps.sortedMS)
		ps.Latency = latencySummary(ps.sortedMS)
		if elapsed > 0 {
			ps.PerSec = float64(ps.OK) / elapsed.Seconds()
		}
		rep.Calls += ps.Calls
		rep.OK += ps.OK
		rep.sortedMS = append(rep.sortedMS, ps.sortedMS...)
		rep.Procs = append(rep.Procs, ps)
	}
	for _, w := range workers {
		for k, s := range w.sample {
			if s != "" && (rep.Samples == nil || rep.Samples[names[k]] == "") {
				if rep.Samples == nil {
					rep.Samples = map[string]string{}
				}
				rep.Samples[names[k]] = s
			}
		}
	}
	rep.Failed = rep.Calls - rep.OK
	slices.Sort(rep.sortedMS)
	rep.Latency = latencySummary(rep.sortedMS)
	rep.Hist = benchHistogram(rep.sortedMS)
	if elapsed > 0 {
		rep.CallsPS = float64(rep.Calls) / elapsed.Seconds()
		rep.OKPS = float64(rep.OK) / elapsed.Seconds()
	}
}

// benchRPCErrors counts failed calls that are neither stat_fail nor timeouts.
func benchRPCErrors(errs map[string]int) int {
	n := 0
	for k, v := range errs {
		if k != "stat_fail" && k != "timeout" {
			n += v
		}
	}
	return n
}

// PrintMon writes the human summary.
func PrintMon(w io.Writer, rep *MonReport) error {
	procs := "SM_MON"
	if rep.Unmon {
		procs = "SM_MON + SM_UNMON"
	}
	from := "port " + rep.PortFrom
	if rep.PortFrom == "portmapper" {
		from = "port from the portmapper"
	}
	src := "ordinary source port"
	if rep.Privileged {
		src = "privileged source port"
	}
	fmt.Fprintf(w, "\nbench mon: %s over %s to %s (%s), %d connection(s) × depth %d, from %s (%s)\n",
		procs, rep.Proto, rep.Target, from, rep.Conns, rep.Depth, dash(rep.Source), src)
	fmt.Fprintf(w, "mon_name %s … %s, my_name %s, my_id %d/%d/%d", rep.MonFirst, dash(rep.MonLast), rep.MyName, benchMyProg, benchMyVers, benchMyProc)
	if rep.Warmup > 0 {
		fmt.Fprintf(w, "; warmup %d calls (%d failed)", rep.Warmup, rep.WarmupErrs)
	}
	fmt.Fprintf(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PROC\tCALLS\tOK\tSTAT_FAIL\tRPC_ERR\tTIMEOUT\tOK/S\tP50\tP90\tP99\tMAX\t")
	row := func(name string, calls, ok int, errs map[string]int, perSec float64, l Latency) {
		lat := []string{"-", "-", "-", "-"}
		if l.N > 0 {
			lat = []string{drill.FormatMS(l.P50MS), drill.FormatMS(l.P90MS), drill.FormatMS(l.P99MS), drill.FormatMS(l.MaxMS)}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.0f\t%s\t", name, calls, ok, errs["stat_fail"], benchRPCErrors(errs), errs["timeout"], perSec, strings.Join(lat, "\t"))
		fmt.Fprintln(tw)
	}
	for _, p := range rep.Procs {
		row(p.Proc, p.Calls, p.OK, p.Errors, p.PerSec, p.Latency)
	}
	if len(rep.Procs) > 1 {
		row("all", rep.Calls, rep.OK, rep.Errors, rep.OKPS, rep.Latency)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d calls in %s: %.0f calls/s, %.0f ok/s", rep.Calls, drill.FormatDuration(time.Duration(rep.ElapsedS*float64(time.Second))), rep.CallsPS, rep.OKPS)
	if rep.Latency.N > 0 {
		fmt.Fprintf(w, "; latency mean %s, p99.9 %s", drill.FormatMS(rep.Latency.MeanMS), drill.FormatMS(rep.Latency.P999MS))
	}
	fmt.Fprintln(w)
	if rep.Failed > 0 {
		fmt.Fprintf(w, "\n%d failed:\n", rep.Failed)
		for _, k := range benchErrNames() {
			if n := rep.Errors[k]; n > 0 {
				fmt.Fprintf(w, "  %-13s %6d  e.g. %s\n", k, n, rep.Samples[k])
			}
		}
	}
	if rep.Stopped != "" {
		fmt.Fprintf(w, "\nstopped early: %s\n", rep.Stopped)
	}
	return nil
}
