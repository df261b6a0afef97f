//go:build !linux

package bench

import (
	"context"
	"errors"
	"io"
	"syscall"
)

var errBenchNotifyLinux = errors.New("bench notify needs Linux network namespaces")

func NotifyInNetns(context.Context, NotifyOptions, string, []string, io.Writer) (*NotifyReport, error) {
	return nil, errBenchNotifyLinux
}

func benchNotifyCheckPrivateNetns() error { return errBenchNotifyLinux }

func benchNotifyRaiseNofile(uint64) (uint64, error) { return 0, errBenchNotifyLinux }

func benchNotifyHosts(string) error { return errBenchNotifyLinux }

func benchNotifyChildAttr() *syscall.SysProcAttr { return nil }
