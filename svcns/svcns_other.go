//go:build !linux

package svcns

import (
	"context"
	"net"
)

// NS is one service namespace; on this platform there is none.
type NS struct{ cfg Config }

// Name is the namespace's name.
func (n *NS) Name() string { return n.cfg.Name }

// Path is the namespace's file.
func (n *NS) Path() string { return NetnsDir + "/" + n.cfg.Name }

// RunDir is the service's run directory.
func (n *NS) RunDir() string { return n.cfg.RunDir }

// Link is the macvlan's name inside the namespace.
func (n *NS) Link() string { return n.cfg.Link }

// Create returns ErrUnsupported.
func Create(Config) (*NS, error) { return nil, ErrUnsupported }

// Open returns ErrUnsupported.
func Open(Config) (*NS, bool, error) { return nil, false, ErrUnsupported }

// Do returns ErrUnsupported.
func (n *NS) Do(func() error) error { return ErrUnsupported }

// Listen returns ErrUnsupported.
func (n *NS) Listen(string, string) (net.Listener, error) { return nil, ErrUnsupported }

// ListenPacket returns ErrUnsupported.
func (n *NS) ListenPacket(string, string) (net.PacketConn, error) { return nil, ErrUnsupported }

// DialContext returns ErrUnsupported.
func (n *NS) DialContext(context.Context, *net.Dialer, string, string) (net.Conn, error) {
	return nil, ErrUnsupported
}

// Processes returns ErrUnsupported.
func (n *NS) Processes() ([]int, error) { return nil, ErrUnsupported }

// NfsdThreads returns ErrUnsupported.
func (n *NS) NfsdThreads() (int, error) { return 0, ErrUnsupported }

// Remove returns ErrUnsupported.
func (n *NS) Remove(context.Context) error { return ErrUnsupported }
