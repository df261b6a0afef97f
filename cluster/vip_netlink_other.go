//go:build !linux

package cluster

import (
	"errors"
	"log/slog"
)

func newVIPLink(NetlinkVIPConfig, *slog.Logger) (vipLink, error) {
	return nil, errors.New("vip: vip_mode netlink needs Linux")
}

func isNoDevice(error) bool { return false }
