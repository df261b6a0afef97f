package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nsmd/nsmd/service"
)

// A service's network namespace (DESIGN.md, "A namespace per service"):
// with service_namespaces on, each service this server serves runs in a
// network namespace of its own, with its own kernel nfsd, lockd and grace,
// so that a service arriving on a server never puts the clients of the
// services already there in grace. nsmd owns the namespace's life, as it
// owns the address: the room makes it at the service's start, before the
// address (a macvlan of the service's interface inside it, with the
// address) and the service's NSM (its listeners inside); the hook mounts
// the storage and starts rpcbind, mountd and nfsd in it; the stop runs
// the hook, then removes the namespace — every process left in it killed,
// nfsd proven stopped, its filesystems unmounted — and only then is the
// stop done. A namespace a previous process left is removed at the stop
// at start (epoch 0), after the hook's stop ran in it.

// defaultServiceRunRoot holds each service's run directory
// (NSMD_SERVICE_RUN_DIR): <root>/<id>, with the namespace's nfsd and
// rpc_pipefs filesystems and the service's private /run and /var/lib/nfs.
const defaultServiceRunRoot = "/run/nsmd/services"

// svcNamespace is one service's namespace as its room uses it (svcns.NS).
type svcNamespace interface {
	// Do runs fn on a thread inside the namespace: the sockets fn opens
	// belong to it.
	Do(fn func() error) error
	// Remove tears it down; an error means the service may still be
	// served in it.
	Remove(ctx context.Context) error
}

// namespaces makes and finds the services' namespaces.
type namespaces interface {
	// create makes service spec's namespace (its run directory runDir);
	// it fails when one exists.
	create(spec service.Spec, runDir string) (svcNamespace, error)
	// open is the namespace of spec a previous run left, if any.
	open(spec service.Spec, runDir string) (svcNamespace, bool, error)
}

// nsRemoveTimeout bounds a namespace's removal (its processes' exit).
const nsRemoveTimeout = 30 * time.Second

// runDir is service id's run directory.
func (r *serviceRoom) runDir(id string) string {
	root := r.cfg.runRoot
	if root == "" {
		root = defaultServiceRunRoot
	}
	return filepath.Join(root, id)
}

// namespaced reports whether services run in namespaces of their own.
func (r *serviceRoom) namespaced() bool { return r.cfg.ns != nil }

// nsEnv is what a service's hooks are told of its namespace.
func (r *serviceRoom) nsEnv(id string) []string {
	if !r.namespaced() {
		return []string{"NSMD_SERVICE_NAMESPACES=off"}
	}
	return []string{"NSMD_SERVICE_NAMESPACES=on", "NSMD_SERVICE_RUN_DIR=" + r.runDir(id)}
}

// enterNamespace makes s's namespace for a start: one left by a failed
// stop or a previous process is removed first (never adopted: what runs
// in it is not known).
func (r *serviceRoom) enterNamespace(ctx context.Context, s *svcRoom) error {
	if !r.namespaced() {
		return nil
	}
	if err := r.removeNamespace(ctx, s); err != nil {
		return err
	}
	ns, err := r.cfg.ns.create(s.spec, r.runDir(s.spec.ID))
	if err != nil {
		return fmt.Errorf("service %s: make its network namespace %s: %w", s.spec.ID, s.spec.EffectiveNamespace(), err)
	}
	s.mu.Lock()
	s.ns = ns
	s.mu.Unlock()
	return nil
}

// removeNamespace removes s's namespace, the one this process made or
// one a previous process left; none is fine.
func (r *serviceRoom) removeNamespace(ctx context.Context, s *svcRoom) error {
	if !r.namespaced() {
		return nil
	}
	s.mu.Lock()
	ns := s.ns
	s.mu.Unlock()
	if ns == nil {
		var ok bool
		var err error
		ns, ok, err = r.cfg.ns.open(s.spec, r.runDir(s.spec.ID))
		if err != nil {
			return fmt.Errorf("service %s: find its network namespace %s: %w", s.spec.ID, s.spec.EffectiveNamespace(), err)
		}
		if !ok {
			return nil
		}
		r.cfg.log.Warn("removing a network namespace of the service left by an earlier run", "service", s.spec.ID, "namespace", s.spec.EffectiveNamespace())
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nsRemoveTimeout)
	defer cancel()
	if err := ns.Remove(ctx); err != nil {
		return fmt.Errorf("service %s: remove its network namespace %s: %w", s.spec.ID, s.spec.EffectiveNamespace(), err)
	}
	s.mu.Lock()
	s.ns = nil
	s.mu.Unlock()
	return nil
}

// namespaceOf is s's namespace now (nil: none, or not namespaced).
func (s *svcRoom) namespaceOf() svcNamespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns
}

// within is fn run inside ns, or here when ns is nil.
func within(ns svcNamespace, fn func() error) error {
	if ns == nil {
		return fn()
	}
	return ns.Do(fn)
}

// errNoNamespace: a namespaced step found no namespace (a bug: the start
// makes it first).
var errNoNamespace = errors.New("the service has no network namespace")
