//go:build !linux

package fence

import "errors"

var errNotLinux = errors.New("fence: only Linux is supported")

func waitExited(pid int) error     { return errNotLinux }
func killGroup(pgid int)           {}
func checkExecutable(string) error { return errNotLinux }
