//go:build linux

package fence

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// waitExited blocks until process pid has exited, without reaping it
// (WNOWAIT): its pid and process group ID stay reserved until cmd.Wait.
func waitExited(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("waitid %d: %w", pid, err)
		}
		return nil
	}
}

// killGroup kills process group pgid; a group already gone is no error.
func killGroup(pgid int) {
	_ = unix.Kill(-pgid, unix.SIGKILL)
}

// checkExecutable reports whether this process (its effective IDs) may
// execute path.
func checkExecutable(path string) error {
	return unix.Faccessat(unix.AT_FDCWD, path, unix.X_OK, unix.AT_EACCESS)
}
