package admin

// NamesHidden is what an unprivileged reader is told where client names
// were withheld (the status page's registrations, grace's missing clients).
const NamesHidden = "names are shown only to an operator: a client certificate of the cluster CA or the admin token"

// ForReader is s as a reader may see it. An operator (privileged) sees
// everything; anyone else sees counts but no client names (grace's missing
// clients and when each was last seen: the names of the cluster's NFS
// clients, as registrations are) and no hook output (it may say anything
// about the host). s is not changed.
func (s Status) ForReader(privileged bool) Status {
	if privileged {
		return s
	}
	s.LastHookFailure = s.LastHookFailure.withoutOutput()
	s.Grace = s.Grace.withoutNames()
	return s
}

// withoutOutput is f without the hook's output (a copy; nil for nil).
func (f *HookFailure) withoutOutput() *HookFailure {
	if f == nil || f.Output == "" {
		return f
	}
	hidden := *f
	hidden.Output = ""
	return &hidden
}

// withoutNames is g with its client names replaced by their counts (a
// copy; nil for nil).
func (g *Grace) withoutNames() *Grace {
	if g == nil {
		return nil
	}
	hidden := *g
	hidden.NLM, hidden.NFSv4 = g.NLM.withoutNames(), g.NFSv4.withoutNames()
	return &hidden
}

// withoutNames is m with its client names replaced by their count.
func (m GraceManager) withoutNames() GraceManager {
	m.MissingHidden += len(m.Missing)
	m.Missing, m.LastSeen = nil, nil
	return m
}
