package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// raft logs its configuration as hclog.Fmt("%+v", servers): the adapter
// must render it, not pass "[%+v [...]]" through.
func TestHclogAdapterRendersDeferredFormats(t *testing.T) {
	var buf bytes.Buffer
	l := newHclog(slog.New(slog.NewTextHandler(&buf, nil)), "raft", slog.LevelInfo)
	servers := []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: "10.0.0.1:7300"}}
	l.Info("initial configuration", "servers", hclog.Fmt("%+v", servers), "flags", hclog.Hex(255), "q", hclog.Quote("a b"))
	out := buf.String()
	for _, want := range []string{"servers=\"[{Suffrage:Voter ID:n1 Address:10.0.0.1:7300}]\"", "flags=0xff", `q="\"a b\""`} {
		if !strings.Contains(out, want) {
			t.Fatalf("log line %q lacks %s", out, want)
		}
	}
	if strings.Contains(out, "%+v") {
		t.Fatalf("format verb passed through: %s", out)
	}
}
