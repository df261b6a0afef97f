// Package svcns is one service's network namespace on the server that
// serves it: the named namespace (a /run/netns/<name> file exactly as
// `ip netns add` makes it, so `ip netns exec <name> …` works), a macvlan
// off the server's interface created straight into it, and the run
// directory the service's hook and kernel state live in:
//
//	RunDir/nfsd/        the namespace's nfsd filesystem (mounted from inside it)
//	RunDir/rpc_pipefs/  the namespace's rpc_pipefs (mounted from inside it)
//	RunDir/run/         the service's private /run (the hook binds it there)
//	RunDir/state/       the service's /var/lib/nfs (the hook binds it there)
//
// nsmd runs code inside the namespace with Do (and Listen, ListenPacket,
// DialContext on it): sockets opened there belong to the namespace for
// good, so the service's NSM listeners, its address (a vip.Netlink made
// inside Do) and its SM_NOTIFY all live there, while the rest of nsmd stays
// in its own namespace.
//
// Remove undoes all of it, in an order that never leaves the service served
// by a half-removed namespace: the processes in the namespace are stopped,
// nfsd must have no threads, the filesystems are unmounted (a busy one is
// an error, never lazily detached), then the macvlan, the name and the run
// directory go. It touches only what belongs to the namespace: processes are
// found by the identity (device and inode) of their network namespace,
// never by name.
//
// Linux only; on other platforms every call returns an error saying so.
package svcns

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/nsmd/nsmd/service"
)

// NetnsDir is where named network namespaces live, as iproute2 keeps them.
const NetnsDir = "/run/netns"

// DefaultRunRoot is the root of the services' run directories:
// RunDir = DefaultRunRoot/<service id>.
const DefaultRunRoot = "/run/nsmd/services"

// MaxNameLen bounds a namespace name (service.ValidNamespace's rule).
const MaxNameLen = service.MaxNamespaceLen

// ErrExists: Create found the name (or the run directory) already there.
// The caller removes a stale one first (Open, then Remove).
var ErrExists = errors.New("svcns: already exists")

// ErrUnsupported: the platform has no network namespaces.
var ErrUnsupported = errors.New("svcns: service network namespaces need Linux")

// Config names one service namespace and what it is made of.
type Config struct {
	// Name is the network namespace's name: /run/netns/<Name>. 1 to 64
	// letters, digits, '_', '.' or '-', starting with a letter or digit.
	Name string
	// RunDir is the service's run directory (absolute), e.g.
	// /run/nsmd/services/<id>.
	RunDir string
	// Parent is the macvlan's lower interface, in the caller's namespace.
	Parent string
	// Link is the macvlan's name inside the namespace; default Parent.
	Link string
	// Mounts: mount nfsd and rpc_pipefs into RunDir from inside the
	// namespace. Create refuses, naming the filesystem, when the kernel has
	// either not. Off only where the kernel has no NFS server (tests).
	Mounts bool
	// Logger; nil logs nothing.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Link == "" {
		c.Link = c.Parent
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the names and paths without looking at the system.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case !service.ValidNamespace(c.Name):
		return fmt.Errorf("svcns: namespace name %q must be 1 to %d letters, digits, '_', '.' or '-', starting with a letter or digit", c.Name, MaxNameLen)
	case c.RunDir == "" || !filepath.IsAbs(c.RunDir) || filepath.Clean(c.RunDir) != c.RunDir || c.RunDir == "/":
		return fmt.Errorf("svcns: run directory %q must be a clean absolute path below /", c.RunDir)
	case c.Parent == "":
		return errors.New("svcns: parent interface is not set")
	case !service.ValidInterface(c.Parent):
		return fmt.Errorf("svcns: parent interface %q is not a valid interface name", c.Parent)
	case !service.ValidInterface(c.Link):
		return fmt.Errorf("svcns: link name %q is not a valid interface name (1 to 15 bytes, no '/', ':' or white space)", c.Link)
	case c.Link == "lo":
		return errors.New(`svcns: link name "lo" is the namespace's own loopback`)
	}
	return nil
}
