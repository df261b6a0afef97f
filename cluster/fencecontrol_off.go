//go:build !fencecontrol

package cluster

// fenceControl is false in every build but the tests' negative control
// (fencecontrol_on.go).
const fenceControl = false
