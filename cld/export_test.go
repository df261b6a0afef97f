//go:build linux

package cld

// Hooks for the external tests (package cld_test).

// SetReadHook makes s call fn for each message it reads, in order, before
// handling it.
func SetReadHook(s *Server, fn func(Msg, error)) { s.onRead = fn }

// SetUnordered drops the order of same-name upcalls and barriers: the
// negative control of the order tests.
func SetUnordered(s *Server) { s.order.unordered = true }

// SetBlockedHook makes s call fn when an upcall has to wait for earlier
// ones (same name, or a barrier) before it may reach the store.
func SetBlockedHook(s *Server, fn func(Msg)) { s.onBlocked = fn }

// SetAnswerHook makes s call fn before it writes the answer to an upcall
// that reached the store.
func SetAnswerHook(s *Server, fn func(Msg)) { s.onAnswer = fn }
