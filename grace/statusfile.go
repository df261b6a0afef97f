package grace

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
)

// statusFile is the file the nfsd-ha hook reads (KEY=value lines, see
// NSMD_NFSV4_TRACKING_STATUS): state (the client-tracking pipe's: waiting,
// open …, or off), error, and grace_start_sm_state, the sm_state of the
// term whose nfsd's GraceStart nsmd answered last. It is rewritten
// atomically, and only when it changed.
type statusFile struct {
	path string
	log  *slog.Logger

	mu              sync.Mutex
	state, errText  string
	graceStartState int32
	written         string
}

// pipe records the pipe's state and rewrites the file if that changed it.
func (f *statusFile) pipe(state, errText string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.errText = state, errText
	f.flush()
}

// graceStart records a new GraceStart's sm_state.
func (f *statusFile) graceStart(graceStartState int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.graceStartState = graceStartState
	f.flush()
}

func (f *statusFile) flush() {
	body := fmt.Sprintf("state=%s\nerror=%s\ngrace_start_sm_state=%d\n", f.state, oneLine(f.errText), f.graceStartState)
	if body == f.written {
		return
	}
	tmp := f.path + ".tmp"
	err := os.WriteFile(tmp, []byte(body), 0o644)
	if err == nil {
		err = os.Rename(tmp, f.path)
	}
	if err != nil {
		f.log.Warn("cannot write the NFSv4 tracking status file", "path", f.path, "err", err)
		return
	}
	f.written = body
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
