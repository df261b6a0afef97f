//go:build !linux

package fence

import "fmt"

// OpenDevice is Linux only.
func OpenDevice(path string) (Device, error) {
	return nil, fmt.Errorf("watchdog %s: %w", path, errNotLinux)
}

// Probe is Linux only.
func Probe(path string) error {
	return fmt.Errorf("watchdog %s: %w", path, errNotLinux)
}

// OpenDeviceLeftRunning is Linux only.
func OpenDeviceLeftRunning(path string) (Device, error) {
	return nil, fmt.Errorf("watchdog %s: %w", path, errNotLinux)
}

// ProbeAt is Linux only.
func ProbeAt(root, path string) error {
	return fmt.Errorf("watchdog %s: %w", path, errNotLinux)
}
