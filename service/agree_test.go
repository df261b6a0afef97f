package service

import "testing"

func TestDisagreementNamesWhoDiffers(t *testing.T) {
	for _, c := range []struct {
		declared map[string]string
		want     string
	}{
		{map[string]string{}, ""},
		{map[string]string{"nfs1": "aa"}, ""},
		{map[string]string{"nfs1": "aa", "nfs2": "aa", "w": "aa"}, ""},
		{map[string]string{"nfs2": "bb", "nfs1": "aa", "w": "aa"},
			"the members' specs of home differ: nfs1, w have aa; nfs2 has bb"},
		{map[string]string{"nfs1": "bb", "nfs2": "aa"},
			"the members' specs of home differ: nfs2 has aa; nfs1 has bb"},
		// The control of "agree": one member without the service differs.
		{map[string]string{"nfs1": "aa", "nfs2": "aa", "w": ""},
			"the members' specs of home differ: nfs1, nfs2 have aa; w does not declare it"},
		{map[string]string{"nfs1": "", "nfs2": ""},
			"the members' specs of home differ: nfs1, nfs2 do not declare it"},
	} {
		for range 20 { // map order must not show
			if got := Disagreement("home", c.declared); got != c.want {
				t.Fatalf("%v: %q, want %q", c.declared, got, c.want)
			}
		}
	}
}
