package service

import (
	"fmt"
	"slices"
	"strings"
)

// Disagreement says how the members' specs of service id differ, in one
// sentence, or "" when they agree. declared maps each member's node id to
// its fingerprint of the service ("": its configuration lacks the
// service). A member that lacks it is a difference too: every member
// carries the same list.
//
// The sentence groups the members by fingerprint, the largest group first
// (ties by fingerprint), so it reads the same on every node:
//
//	the members' specs of scratch differ: nfs1, w have 1111111111111111; nfs2 has 2222222222222222
func Disagreement(id string, declared map[string]string) string {
	groups := map[string][]string{}
	for node, fp := range declared {
		groups[fp] = append(groups[fp], node)
	}
	if len(groups) <= 1 && groups[""] == nil {
		return ""
	}
	fps := make([]string, 0, len(groups))
	for fp, nodes := range groups {
		slices.Sort(nodes)
		if fp != "" {
			fps = append(fps, fp)
		}
	}
	slices.SortFunc(fps, func(a, b string) int {
		if d := len(groups[b]) - len(groups[a]); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, fp := range fps {
		verb := "has"
		if len(groups[fp]) > 1 {
			verb = "have"
		}
		parts = append(parts, fmt.Sprintf("%s %s %s", strings.Join(groups[fp], ", "), verb, fp))
	}
	if missing := groups[""]; missing != nil {
		verb := "does"
		if len(missing) > 1 {
			verb = "do"
		}
		parts = append(parts, fmt.Sprintf("%s %s not declare it", strings.Join(missing, ", "), verb))
	}
	return fmt.Sprintf("the members' specs of %s differ: %s", id, strings.Join(parts, "; "))
}
