package agent

import (
	"testing"

	"github.com/nsmd/nsmd/admin"
)

func TestBuildInfoForms(t *testing.T) {
	for _, c := range []struct {
		b            admin.BuildInfo
		str, gossip  string
		revisionSeen string
	}{
		{admin.BuildInfo{Version: "v1.2.0", GoVersion: "go1.26.8"}, "nsmd v1.2.0 go1.26.8", "v1.2.0", ""},
		{admin.BuildInfo{Version: "(devel)", Revision: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8"},
			"nsmd (devel) (revision 0123456789abcdef0123, modified) go1.26.8", "(devel)+0123456789ab+modified", "0123456789abcdef0123+modified"},
		{admin.BuildInfo{Version: "0123456-dirty", Revision: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8"},
			"nsmd 0123456-dirty (revision 0123456789abcdef0123, modified) go1.26.8", "0123456-dirty", "0123456789abcdef0123+modified"},
		{admin.BuildInfo{Version: "v0.0.0-20250101000000-0123456789ab", Revision: "0123456789abcdef", GoVersion: "go1.26.8"},
			"nsmd v0.0.0-20250101000000-0123456789ab (revision 0123456789abcdef) go1.26.8", "v0.0.0-20250101000000-0123456789ab", "0123456789abcdef"},
	} {
		if got := c.b.String(); got != c.str {
			t.Errorf("String() = %q, want %q", got, c.str)
		}
		if got := c.b.Gossip(); got != c.gossip {
			t.Errorf("Gossip() = %q, want %q", got, c.gossip)
		}
		if got := revisionLabel(c.b); got != c.revisionSeen {
			t.Errorf("revision label = %q, want %q", got, c.revisionSeen)
		}
	}
}
