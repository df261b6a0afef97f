//go:build !linux

package main

import (
	"context"
	"errors"
	"io"
	"syscall"
)

var errBenchNotifyLinux = errors.New("bench notify needs Linux network namespaces")

func benchNotifyNetns(context.Context, benchNotifyOptions, string, []string, io.Writer) (*benchNotifyReport, error) {
	return nil, errBenchNotifyLinux
}

func benchNotifyCheckPrivateNetns() error { return errBenchNotifyLinux }

func benchNotifyRaiseNofile(uint64) (uint64, error) { return 0, errBenchNotifyLinux }

func benchNotifyHosts(string) error { return errBenchNotifyLinux }

func benchNotifyChildAttr() *syscall.SysProcAttr { return nil }
