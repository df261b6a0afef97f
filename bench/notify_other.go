//go:build !linux

package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
)

var errBenchNotifyLinux = errors.New("bench notify needs Linux network namespaces")

func NotifyInNetns(context.Context, NotifyOptions, string, []string, io.Writer) (*NotifyReport, error) {
	return nil, errBenchNotifyLinux
}

func notifyCheckPrivateNetns() error { return errBenchNotifyLinux }

func notifyRaiseNofile(uint64) (uint64, error) { return 0, errBenchNotifyLinux }

func notifyHosts(string) error { return errBenchNotifyLinux }

func notifyChildAttr() *syscall.SysProcAttr { return nil }

func listenPktinfo(uint16) (*net.UDPConn, error) { return nil, errBenchNotifyLinux }

func pktinfoDst([]byte) (netip.Addr, bool) { return netip.Addr{}, false }

func pktinfoSrc(netip.Addr) []byte { return nil }
