//go:build race

package nsm

const raceEnabled = true
