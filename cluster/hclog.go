package cluster

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter routes hashicorp/raft's hclog output into our slog logger,
// so every log line of the process is structured the same way.
type hclogAdapter struct {
	l     *slog.Logger
	name  string
	args  []any
	level slog.Level
}

func newHclog(l *slog.Logger, name string, level slog.Level) hclog.Logger {
	return &hclogAdapter{l: l, name: name, level: level}
}

func (h *hclogAdapter) slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	lv := h.slogLevel(level)
	if lv < h.level || !h.l.Enabled(context.Background(), lv) {
		return
	}
	all := make([]any, 0, len(h.args)+len(args)+2)
	all = append(all, "component", h.name)
	all = append(all, h.args...)
	for _, a := range args {
		all = append(all, hclogValue(a))
	}
	h.l.Log(context.Background(), lv, msg, all...)
}

// hclogValue renders hclog's deferred-formatting values (hclog.Fmt,
// Hex, Octal, Binary, Quote) as hclog itself would; raft logs its
// configuration with hclog.Fmt("%+v", servers), which slog would print as
// the raw format and arguments.
func hclogValue(v any) any {
	switch v := v.(type) {
	case hclog.Format:
		if len(v) == 0 {
			return ""
		}
		f, ok := v[0].(string)
		if !ok {
			return fmt.Sprint(v...)
		}
		return fmt.Sprintf(f, v[1:]...)
	case hclog.Hex:
		return fmt.Sprintf("0x%x", int(v))
	case hclog.Octal:
		return fmt.Sprintf("0%o", int(v))
	case hclog.Binary:
		return fmt.Sprintf("0b%b", int(v))
	case hclog.Quote:
		return fmt.Sprintf("%q", string(v))
	}
	return v
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) enabled(l slog.Level) bool {
	return l >= h.level && h.l.Enabled(context.Background(), l)
}
func (h *hclogAdapter) IsTrace() bool { return false }
func (h *hclogAdapter) IsDebug() bool { return h.enabled(slog.LevelDebug) }
func (h *hclogAdapter) IsInfo() bool  { return h.enabled(slog.LevelInfo) }
func (h *hclogAdapter) IsWarn() bool  { return h.enabled(slog.LevelWarn) }
func (h *hclogAdapter) IsError() bool { return h.enabled(slog.LevelError) }

func (h *hclogAdapter) ImpliedArgs() []any { return h.args }
func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any{}, h.args...), args...)
	return &c
}
func (h *hclogAdapter) Name() string { return h.name }
func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}
func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}
func (h *hclogAdapter) SetLevel(hclog.Level) {}
func (h *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case h.level <= slog.LevelDebug:
		return hclog.Debug
	case h.level <= slog.LevelInfo:
		return hclog.Info
	case h.level <= slog.LevelWarn:
		return hclog.Warn
	}
	return hclog.Error
}
func (h *hclogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(nil), "", 0)
}
func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		msg := strings.TrimSpace(string(p))
		level := hclog.Info
		for prefix, lv := range map[string]hclog.Level{"[ERR]": hclog.Error, "[ERROR]": hclog.Error, "[WARN]": hclog.Warn, "[DEBUG]": hclog.Debug, "[TRACE]": hclog.Trace, "[INFO]": hclog.Info} {
			if i := strings.Index(msg, prefix); i >= 0 {
				level, msg = lv, strings.TrimSpace(msg[i+len(prefix):])
				break
			}
		}
		h.Log(level, msg)
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
