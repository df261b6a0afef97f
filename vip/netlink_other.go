//go:build !linux

package vip

import (
	"errors"
	"log/slog"
)

func newLink(NetlinkConfig, *slog.Logger) (link, error) {
	return nil, errors.New("vip: vip_mode netlink needs Linux")
}

func isNoDevice(error) bool { return false }
