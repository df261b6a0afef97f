package agent

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/grace"
	"github.com/nsmd/nsmd/service"
	"github.com/nsmd/nsmd/timeline"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files of the admin API's wire form")

// fullTimeline has every step of a takeover set, each a millisecond apart.
func fullTimeline(at time.Time) timeline.Timeline {
	tl := timeline.Timeline{State: 7}
	for i, s := range timeline.Steps() {
		tl.Mark(s, at.Add(time.Duration(i)*time.Millisecond))
	}
	return tl
}

// fill sets every field of the struct v points to (recursively, through
// pointers) to a value that is not zero.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(3)
	case reflect.Uint8, reflect.Uint64:
		v.SetUint(3)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		v.SetMapIndex(k, e)
	}
}

// zeroFields lists the fields of v (recursively) that are zero.
func zeroFields(v reflect.Value, path string) []string {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return []string{path}
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeFor[time.Time]() {
		if v.IsZero() {
			return []string{path}
		}
		return nil
	}
	var out []string
	for i := range v.NumField() {
		out = append(out, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
	}
	return out
}

func filled[T any]() T {
	var v T
	fill(reflect.ValueOf(&v).Elem())
	return v
}

// TestAdminMappingCarriesEveryField: each mapping from a part's type to
// the admin API's fills every field of the API's type from a source with
// every field set — a field added to either side and not mapped fails
// here.
func TestAdminMappingCarriesEveryField(t *testing.T) {
	for _, c := range []struct {
		name string
		out  any
	}{
		{"member", memberJSON(filled[cluster.MemberStatus]())},
		{"disk", diskJSON(filled[cluster.DiskStatus]())},
		{"pipe", pipeJSON(filled[cld.Status]())},
		{"grace", graceJSON(new(filled[grace.Status]()), func(string) (time.Time, bool) { return time.Unix(5, 0), true })},
		{"timeline", admin.TimelineOf(fullTimeline(time.Unix(1, 0)))},
		{"service run", serviceRunJSON("n1", func() cluster.ServiceRun {
			r := filled[cluster.ServiceRun]()
			r.LeaseLeft, r.Proof.Took = 2*time.Second, time.Second // fill's 3ns round to 0 ms
			return r
		}())},
		{"service local", serviceLocalJSON("n1", filled[serviceRoomStatus]())},
		{"service nfsv4", serviceNFSv4JSON(filled[serviceV4Status]())},
	} {
		z := zeroFields(reflect.ValueOf(c.out), c.name)
		// Only NFSv4 clients are dated (no NLM equivalent of a lease).
		// MissingHidden is the admin handler's, for readers who are not
		// operators (admin.Status.ForReader), not a part's. A service's
		// local NFSv4 and grace are its NFSv4 side's (the "service nfsv4"
		// and "grace" mappings), not its room's.
		z = slices.DeleteFunc(z, func(f string) bool {
			return f == "grace.NLM.LastSeen" || strings.HasSuffix(f, ".MissingHidden") ||
				f == "service local.NFSv4" || f == "service local.Grace"
		})
		if len(z) > 0 {
			t.Errorf("%s: not mapped: %v", c.name, z)
		}
	}
	if tl := admin.TimelineOf(fullTimeline(time.Unix(1, 0))); len(tl.Steps) != len(timeline.Steps()) {
		t.Errorf("timeline: %d steps mapped, the table has %d", len(tl.Steps), len(timeline.Steps()))
	}
}

// wireOfEveryPart is the admin API's JSON of every part that comes from
// another package, through its mapping.
func wireOfEveryPart() map[string]any {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	first := timeline.Timeline{State: 5}
	for _, s := range []timeline.Step{timeline.Elected, timeline.Committed, timeline.VIP, timeline.OnLeaderDone} {
		first.Mark(s, at)
	}
	withNames := &grace.Status{SMState: 7, Started: at, Settle: 3 * time.Second, LastActivity: at.Add(time.Second),
		NLM:   grace.ManagerStatus{Expected: 2, Back: 2, Ended: &grace.End{At: at.Add(4 * time.Second), After: 4500 * time.Millisecond, Reason: grace.ReasonAllReclaimed}},
		NFSv4: grace.ManagerStatus{Expected: 3, Back: 1, Missing: []string{"Linux NFSv4.2 gone", "Linux NFSv4.1 unseen"}},
	}
	lastSeen := func(name string) (time.Time, bool) {
		if name == "Linux NFSv4.2 gone" {
			return at.Add(-26*time.Hour + 400*time.Millisecond), true
		}
		return time.Time{}, false
	}
	return map[string]any{
		// What a reader who is not an operator gets: counts, no names.
		"grace_for_reader":     admin.Status{Grace: graceJSON(withNames, lastSeen)}.ForReader(false).Grace,
		"member":               memberJSON(cluster.MemberStatus{ID: "n1", GossipAddr: "a:1", RaftAddr: "a:2", NSMAddr: "a:3", Version: "v", State: "alive", Suffrage: "Voter", Leader: true, Role: "leader"}),
		"witness":              memberJSON(cluster.MemberStatus{ID: "w", Witness: true, Role: "witness"}),
		"disk":                 diskJSON(cluster.DiskStatus{Writable: false, Since: at, Error: "EIO", Failures: 2, Slow: true, SlowSince: at, WriteP50: 70 * time.Millisecond}),
		"healthy_disk":         diskJSON(cluster.DiskStatus{Writable: true, Since: at}),
		"timeline_first_steps": admin.TimelineOf(first),
		"timeline_every_step":  admin.TimelineOf(fullTimeline(at)),
		"timeline_not_taken":   admin.TimelineOf(timeline.Timeline{State: 9}),
		"grace":                graceJSON(withNames, lastSeen),
		"grace_absent_nfsd": graceJSON(&grace.Status{Started: at, Settle: time.Second, Error: "grace_end is timer: nsmd does not end grace",
			NLM: grace.ManagerStatus{Ended: &grace.End{At: at, Reason: grace.ReasonNothingToReclaim}}, NFSv4: grace.ManagerStatus{Absent: true}}, nil),
		"pipe": pipeJSON(cld.Status{Pipe: "/p/nfsd/cld", State: cld.StateOpen, Since: at, Version: 2,
			LastGraceStart: at, LastGraceStartRecords: 3, Upcalls: map[string]uint64{"create": 4, "grace_start": 1}, Failed: 1}),
		"pipe_waiting": pipeJSON(cld.Status{Pipe: "/p/nfsd/cld", State: cld.StateWaiting, Since: at, Upcalls: map[string]uint64{}}),
		"fence_promises": &admin.FencePromises{
			Servers: []admin.FencePromise{
				{Node: "s1", Mode: "watchdog", WatchdogSeconds: 8, LeaseSeconds: 2.5, HookTimeoutSeconds: 60, MarginSeconds: 2, Source: "self"},
				{Node: "s2", Mode: "off", LeaseSeconds: 2.5, HookTimeoutSeconds: 60, MarginSeconds: 2, Source: "record", Serving: true},
				{Node: "s3", Mode: "unknown", Source: "unknown"},
			},
			Mismatch: true, Unproven: []string{"s2"},
			Confirmations: []admin.FenceConfirmation{{Node: "s4", By: "alice (client certificate from 192.0.2.7)", At: at}},
		},
		"fence_confirm": admin.FenceConfirmResult{Node: "s2", By: "alice (token from 127.0.0.1)", Result: "confirmed"},
		// GET /v1/services (and the overview's services): one of each state.
		"services": []admin.ServiceStatus{
			{ID: "home", Address: "10.0.0.50/24", Owner: "nfs1", Epoch: 4, State: admin.ServiceServing, Fingerprint: "832063574c84a0fe",
				DeclaredBy: map[string]string{"nfs1": "832063574c84a0fe", "nfs2": "832063574c84a0fe", "w": "832063574c84a0fe"},
				LastMove:   &admin.ServiceMove{From: "nfs2", To: "nfs1", Reason: "planned", At: at, Epoch: 4},
				// What the node that serves it (nfs1) adds.
				Run: serviceRunJSON("nfs1", cluster.ServiceRun{Service: "home", Epoch: 4, Phase: "serving", LeaseLeft: 2345678 * time.Microsecond,
					Proof: cluster.FencedPeer{Node: "nfs2", By: "clean", Took: 120 * time.Millisecond, Detail: "it answered that it stopped epoch 3"}}),
				Local: withServiceV4(serviceLocalJSON("nfs1", serviceRoomStatus{Service: "home", Epoch: 4, Phase: roomServing, AddressHeld: true, Namespace: "nsmd-home",
					LastHook: &roomHookResult{Hook: "on_leader", Reason: "start", Epoch: 4, At: at}}),
					// Its NFSv4 side (service namespaces): its own pipe, records and grace.
					serviceNFSv4JSON(serviceV4Status{Tracking: true, Pipe: &cld.Status{Pipe: "/run/nsmd/services/home/rpc_pipefs/nfsd/cld", State: cld.StateOpen, Since: at, Version: 2,
						LastGraceStart: at, LastGraceStartRecords: 3, Upcalls: map[string]uint64{"create": 1, "grace_start": 1}},
						CurrentEpoch: 5, RecoveryEpoch: 4, Clients: 1, Reclaimable: 3, Reclaimed: 1, GraceStartSMState: 9, GraceStartAt: at}),
					graceJSON(&grace.Status{SMState: 9, Started: at, Settle: 3 * time.Second,
						NLM:   grace.ManagerStatus{Expected: 1, Back: 1, Ended: &grace.End{At: at.Add(2 * time.Second), After: 2 * time.Second, Reason: grace.ReasonAllReclaimed}},
						NFSv4: grace.ManagerStatus{Expected: 3, Back: 1, Missing: []string{"Linux NFSv4.2 c2", "Linux NFSv4.1 c3"}}}, nil))},
			{ID: "projects", Address: "10.0.0.52/24", Owner: "nfs2", Epoch: 2, State: admin.ServiceMoving, Fingerprint: "0123456789abcdef",
				DeclaredBy: map[string]string{"nfs1": "0123456789abcdef", "nfs2": "0123456789abcdef"},
				LastMove:   &admin.ServiceMove{To: "nfs2", Reason: "placed", At: at, Epoch: 2}},
			{ID: "archive", Address: "fd00::53/64", State: admin.ServiceUnplaced, Fingerprint: "fedcba9876543210",
				DeclaredBy: map[string]string{"nfs1": "fedcba9876543210"}},
			{ID: "scratch", Address: "10.0.0.51/24", Owner: "nfs2", Epoch: 1, State: admin.ServiceConflict, Fingerprint: "1111111111111111",
				DeclaredBy: map[string]string{"nfs1": "1111111111111111", "nfs2": "2222222222222222", "w": ""},
				Conflict:   service.Disagreement("scratch", map[string]string{"nfs1": "1111111111111111", "nfs2": "2222222222222222", "w": ""})},
		},
		"service_move": admin.ServiceMoveResult{Result: "moved", Service: "home", To: "nfs2"},
		// A server whose stop of a service failed, as a reader who is not
		// an operator sees it: the hook's output is left out.
		"services_stop_failed_for_reader": admin.ServicesForReader([]admin.ServiceStatus{
			{ID: "projects", Address: "10.0.0.52/24", Owner: "nfs2", Epoch: 3, State: admin.ServicePlaced, Fingerprint: "0123456789abcdef",
				DeclaredBy: map[string]string{"nfs1": "0123456789abcdef", "nfs2": "0123456789abcdef"},
				Run:        serviceRunJSON("nfs1", cluster.ServiceRun{Service: "projects", Epoch: 2, Phase: "stopping", LeaseLeft: -time.Second}),
				Local: serviceLocalJSON("nfs1", serviceRoomStatus{Service: "projects", Epoch: 2, Phase: roomFailed,
					LastHook:    &roomHookResult{Hook: "on_follower", Reason: "stop", Epoch: 2, Err: "exit status 32", At: at},
					LastFailure: &admin.HookFailure{Hook: "on_follower", Event: "follower", Reason: "stop", At: at, Err: "exit status 32", Output: "umount: /srv/projects: target is busy"}})},
		}, false),
		// A service's NFSv4 side as a reader who is not an operator sees
		// it: the names of the clients its grace waits for are left out;
		// and one without NFSv4 client tracking served.
		"services_grace_for_reader": admin.ServicesForReader([]admin.ServiceStatus{
			{ID: "home", Owner: "nfs1", Epoch: 4, State: admin.ServiceServing, DeclaredBy: map[string]string{},
				Local: withServiceV4(&admin.ServiceLocal{Node: "nfs1", Phase: roomServing, Epoch: 4},
					serviceNFSv4JSON(serviceV4Status{TrackingWhy: "nfsv4_tracking is off", CurrentEpoch: 1}),
					graceJSON(&grace.Status{SMState: 9, Started: at, Settle: 3 * time.Second, Error: "grace_end is timer: nsmd does not end grace",
						NLM:   grace.ManagerStatus{Expected: 2, Missing: []string{"10.0.0.7", "10.0.0.8"}},
						NFSv4: grace.ManagerStatus{Absent: true}}, nil))},
		}, false),
	}
}

// withServiceV4 is l with a service's NFSv4 tracking and grace.
func withServiceV4(l *admin.ServiceLocal, v4 *admin.ServiceNFSv4, g *admin.Grace) *admin.ServiceLocal {
	l.NFSv4, l.Grace = v4, g
	return l
}

// TestAdminWireFormIsTheGoldenOne: the admin API's JSON of members, disk,
// takeover timeline, grace and pipe, byte for byte (testdata; -rewrite
// writes it anew). The file is the wire contract: older CLIs, drills and
// dashboards read it.
func TestAdminWireFormIsTheGoldenOne(t *testing.T) {
	got, err := json.MarshalIndent(wireOfEveryPart(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "admin-wire.golden.json")
	if *rewrite {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("admin wire form changed:\n%s\nwant (%s):\n%s", got, golden, want)
	}
}

// TestTimelineWireFormRoundTrips: a reader gets back every step with its
// label, and keeps a step it does not know (a newer node's) under its
// name, in time order after the known ones.
func TestTimelineWireFormRoundTrips(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	want := admin.TimelineOf(fullTimeline(at))
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got admin.Timeline
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	newer := []byte(`{"elected":"2025-01-02T03:04:05Z","committed":"0001-01-01T00:00:00Z","vip":"0001-01-01T00:00:00Z","on_leader_done":"0001-01-01T00:00:00Z","sm_state":9,"zz_new_step":"2025-01-02T03:04:06Z","a_new_step":"2025-01-02T03:04:07Z","a_new_count":3}`)
	if err := json.Unmarshal(newer, &got); err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, s := range got.Steps {
		names = append(names, s.Name+"="+s.Label)
	}
	if want := []string{"elected=elected", "zz_new_step=zz_new_step", "a_new_step=a_new_step"}; !reflect.DeepEqual(names, want) || got.State != 9 {
		t.Fatalf("newer node's timeline read as %v (sm_state %d), want %v", names, got.State, want)
	}
	again, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(again, []byte(`"zz_new_step":"2025-01-02T03:04:06Z"`)) {
		t.Fatalf("re-marshalled without the unknown step: %s", again)
	}
}
