package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsmd/nsmd/service"
	"github.com/nsmd/nsmd/svcns"
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
	dir := r.runDir(s.spec.ID)
	ns, err := r.cfg.ns.create(s.spec, dir)
	if err != nil {
		return fmt.Errorf("service %s: make its network namespace %s: %w", s.spec.ID, s.spec.EffectiveNamespace(), err)
	}
	if err := os.WriteFile(filepath.Join(dir, nsMarker), []byte(s.spec.EffectiveNamespace()+" "+s.spec.Interface+"\n"), 0o644); err != nil {
		err = fmt.Errorf("service %s: mark its run directory: %w", s.spec.ID, err)
		if rerr := ns.Remove(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return err
	}
	s.mu.Lock()
	s.ns = ns
	s.mu.Unlock()
	if r.cfg.tickleNS != nil {
		r.cfg.tickleNS(s.spec.ID, ns.Do)
	}
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
	if r.cfg.tickleNS != nil {
		r.cfg.tickleNS(s.spec.ID, nil)
	}
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

// nsMarker is the file in a service's run directory that names its
// namespace and the macvlan's lower interface ("<namespace> <interface>"),
// so that a later process finds a namespace whose service has left the
// configuration.
const nsMarker = "namespace"

// removeOrphanNamespaces removes the namespaces an earlier process made
// for services this configuration no longer has (the configured ones are
// removed by their stop at start): before this node serves anything, no
// namespace of its own making is left running an nfsd nobody stops. An
// error stops the agent's start: a namespace it cannot remove may still
// serve a filesystem another server is about to mount.
func (r *serviceRoom) removeOrphanNamespaces(ctx context.Context) error {
	if !r.namespaced() {
		return nil
	}
	root := r.cfg.runRoot
	if root == "" {
		root = defaultServiceRunRoot
	}
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("service namespaces: read %s: %w", root, err)
	}
	var errs []error
	for _, e := range entries {
		if _, ok := r.specs[e.Name()]; ok || !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, nsMarker))
		if err != nil {
			errs = append(errs, fmt.Errorf("service namespaces: %s is not a configured service's and names no namespace: %w", dir, err))
			continue
		}
		name, parent, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		spec := service.Spec{ID: e.Name(), Namespace: name, Interface: parent}
		ns, ok, err := r.cfg.ns.open(spec, dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("service namespaces: find %s (of %s, no longer configured): %w", name, e.Name(), err))
			continue
		}
		if !ok {
			continue
		}
		r.cfg.log.Warn("removing the network namespace of a service no longer configured", "service", e.Name(), "namespace", name)
		rctx, cancel := context.WithTimeout(ctx, nsRemoveTimeout)
		err = ns.Remove(rctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("service namespaces: remove %s (of %s, no longer configured): %w", name, e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// svcnsMaker makes the services' namespaces with package svcns; mounts:
// each gets its own nfsd filesystem and rpc_pipefs (the kernel has nfsd).
type svcnsMaker struct {
	log    *slog.Logger
	mounts bool
}

func (m svcnsMaker) config(spec service.Spec, runDir string) svcns.Config {
	return svcns.Config{Name: spec.EffectiveNamespace(), RunDir: runDir, Parent: spec.Interface, Mounts: m.mounts,
		Logger: m.log.With("service", spec.ID)}
}

func (m svcnsMaker) create(spec service.Spec, runDir string) (svcNamespace, error) {
	return svcns.Create(m.config(spec, runDir))
}

func (m svcnsMaker) open(spec service.Spec, runDir string) (svcNamespace, bool, error) {
	ns, ok, err := svcns.Open(m.config(spec, runDir))
	if err != nil || !ok {
		return nil, false, err
	}
	return ns, true, nil
}
