// Package rtnl is the small rtnetlink codec that nsmd's address and link
// code shares: it builds a request (struct nlmsghdr and a body), appends
// and walks attributes, reads the replies to one request (by its sequence
// number) until NLMSG_DONE or NLMSG_ERROR, and decodes struct nlmsgerr
// with the kernel's extended-ack message. It owns no socket: each caller
// keeps its own (one long-lived, or one per request), its own locking and
// its own sequence numbers. Linux only.
package rtnl
