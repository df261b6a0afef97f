package grace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// V4Client is one NFSv4 client as the running nfsd knows it
// (/proc/fs/nfsd/clients/<id>/info, Linux ≥ 5.3).
type V4Client struct {
	// Name is the client's long-form id (the co_ownerid of SETCLIENTID or
	// EXCHANGE_ID), the key of its client-tracking record.
	Name string
	// Minor is the NFSv4 minor version it uses (0, 1 or 2).
	Minor int
	// Status is confirmed, unconfirmed, courtesy or expirable.
	Status string
	// Address is where it connects from (host:port).
	Address string
	// SinceRenew is how long ago it last renewed its lease ("seconds from
	// last renew", Linux ≥ 5.19, whole seconds); -1 when the kernel does
	// not say. A courtesy client's keeps growing: it is when the client
	// was last seen.
	SinceRenew time.Duration
}

// Confirmed reports whether the client holds a confirmed client id on
// this server: it reached the server after the server started, and (for a
// client that held state before) has reclaimed or is reclaiming.
func (c V4Client) Confirmed() bool { return c.Status == "confirmed" }

// maxRenewSeconds bounds "seconds from last renew" (the kernel's boot
// time in seconds: ~100 years is beyond any).
const maxRenewSeconds = 100 * 365 * 24 * 3600

// maxClientInfo caps how much of one info file is read: the kernel's is a
// few hundred bytes (the name is at most 1024 bytes, escaped ×4).
const maxClientInfo = 16 << 10

// NFSdClients lists the NFSv4 clients of the running nfsd from
// <proc>/fs/nfsd/clients (proc "" = /proc), sorted by name. No nfsd
// filesystem there gives ErrNoManager. A client whose info file vanished
// meanwhile (it was expired) is skipped; a file that does not parse is an
// error naming it.
func NFSdClients(proc string) ([]V4Client, error) {
	if proc == "" {
		proc = "/proc"
	}
	return nfsdClientsIn(filepath.Join(proc, "fs", "nfsd", "clients"))
}

// nfsdClientsIn is NFSdClients of the client directory dir.
func nfsdClientsIn(dir string) ([]V4Client, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: nfsd: no %s", ErrNoManager, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("grace: list nfsd clients: %w", err)
	}
	var out []V4Client
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name(), "info")
		b, err := readCapped(p, maxClientInfo)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("grace: read %s: %w", p, err)
		}
		c, err := parseClientInfo(b)
		if err != nil {
			return nil, fmt.Errorf("grace: %s: %w", p, err)
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b V4Client) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func readCapped(p string, max int) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, max+1)
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil || m == 0 {
			break
		}
	}
	if n > max {
		return nil, fmt.Errorf("longer than %d bytes", max)
	}
	return buf[:n], nil
}

// parseClientInfo reads the "key: value" lines of one info file. The name
// is quoted with the kernel's escapes (\xNN for bytes that are not
// printable ASCII, for '"' and for '\').
func parseClientInfo(b []byte) (V4Client, error) {
	c := V4Client{SinceRenew: -1}
	haveName, haveMinor := false, false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 8192), maxClientInfo)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		switch key {
		case "name":
			n, err := unquoteKernel(val)
			if err != nil {
				return V4Client{}, fmt.Errorf("name %s: %w", val, err)
			}
			c.Name, haveName = n, true
		case "minor version":
			m, err := strconv.Atoi(val)
			if err != nil || m < 0 || m > 2 {
				return V4Client{}, fmt.Errorf("minor version %q", val)
			}
			c.Minor, haveMinor = m, true
		case "status":
			c.Status = val
		case "address":
			c.Address = strings.Trim(val, `"`)
		case "seconds from last renew":
			sec, err := strconv.ParseInt(val, 10, 64)
			if err != nil || sec < 0 || sec > maxRenewSeconds {
				return V4Client{}, fmt.Errorf("seconds from last renew %q", val)
			}
			c.SinceRenew = time.Duration(sec) * time.Second
		}
	}
	if err := sc.Err(); err != nil {
		return V4Client{}, err
	}
	if !haveName || !haveMinor {
		return V4Client{}, errors.New("no name or minor version line")
	}
	return c, nil
}

// unquoteKernel undoes seq_quote_mem: "..." with \xNN escapes.
func unquoteKernel(s string) (string, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", errors.New("not quoted")
	}
	s = s[1 : len(s)-1]
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) || s[i+1] != 'x' {
			return "", fmt.Errorf("bad escape at byte %d", i)
		}
		v, err := strconv.ParseUint(s[i+2:i+4], 16, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape at byte %d", i)
		}
		out.WriteByte(byte(v))
		i += 3
	}
	return out.String(), nil
}
