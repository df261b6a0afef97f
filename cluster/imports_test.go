package cluster

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/nsmd/nsmd/nsm"
)

// The NSM service takes a node's Registry as its Registry; nsm does not
// import this package, so nothing but this says a Registry still fits it
// and the optional interfaces the service looks for.
var (
	_ nsm.Registry      = Registry{}
	_ nsm.Counter       = Registry{}
	_ nsm.ReadyNotifier = Registry{}
	_ nsm.SenderChecker = Registry{}
	_ nsm.HostChecker   = Registry{}
)

// TestClusterSpeaksNoNSM: the replication layer replicates. SM_NOTIFY
// and the lock-manager callbacks are subscribers the caller composes with
// a node (events.go), so nothing this package builds into nsmd depends on
// package nsm, directly or through another package.
func TestClusterSpeaksNoNSM(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/nsmd/nsmd/fsm") {
		t.Fatalf("go list -deps found no fsm among %d packages: the check would prove nothing", len(deps))
	}
	if slices.Contains(deps, "github.com/nsmd/nsmd/nsm") {
		t.Errorf("package cluster depends on github.com/nsmd/nsmd/nsm; its callers compose the notifier and the deliverer with a node instead")
	}
}
