//go:build fencecontrol

package cluster

// fenceControl, set only by the build tag fencecontrol, makes a new
// leader wait by its own settings alone, ignoring the other nodes'
// promises and serving records, and ask nothing when its own fencing is
// off: the behaviour before promises travelled. It exists for the fencing
// drills' negative control only (make e2e builds out/nsmd-fencecontrol);
// never ship it.
const fenceControl = true
