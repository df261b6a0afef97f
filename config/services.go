package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/nsmd/nsmd/service"
)

// ServicesKey is the YAML key of the NFS services list. It is a list of
// mappings, which neither a flag nor an environment variable can express:
// it is set in the config file only.
const ServicesKey = "services"

// ServicesHelp says where services are set, for --help and errors.
const ServicesHelp = "services: (several NFS services, each with its own floating address) is set in the --config file only: a list of mappings that no flag or NSMD_ variable can express (docs/running.md, \"Several NFS services\")"

// serviceSource is where each service of Config.Services was read: the
// file and, per service, the line of its item and of each field given.
type serviceSource struct {
	file  string
	ids   []string // the id read at each index (a line applies only while it still names that service)
	items []int
	keys  []map[string]int
}

// line is the line of service i's field (its item's line for a field not
// given), or 0 when unknown.
func (src *serviceSource) line(i int, id, field string) int {
	if src == nil || i >= len(src.ids) || src.ids[i] != id {
		return 0
	}
	if l := src.keys[i][field]; l > 0 {
		return l
	}
	return src.items[i]
}

// svcProblem is one problem of the services list: service index and
// field (field "" for the list itself).
type svcProblem struct {
	index int
	field string
	err   error
}

// label names service i for an error: its id, or its place in the list
// when it has none (or an invalid one).
func svcLabel(specs []service.Spec, i int) string {
	if i < 0 {
		return ServicesKey
	}
	if id := specs[i].ID; service.ValidID(id) {
		return fmt.Sprintf("service %q", id)
	}
	return fmt.Sprintf("services item %d", i+1)
}

// serviceProblems checks each service and the list as a whole: ids,
// addresses, devices, mounts and namespaces are each one service's. Two
// services on one device could be placed on two servers that then mount
// one filesystem at once; two on one mount point or namespace would
// share what each expects to own; one address is one service to clients.
func serviceProblems(specs []service.Spec) []svcProblem {
	var out []svcProblem
	for i, s := range specs {
		for _, p := range s.Problems() {
			out = append(out, svcProblem{i, p.Field, p.Err})
		}
	}
	type key struct {
		field, value string
	}
	first := map[key]int{}
	for i, s := range specs {
		addr := ""
		if s.Address.IsValid() {
			addr = s.Address.Addr().String()
		}
		for _, k := range []key{{service.FieldID, s.ID}, {service.FieldAddress, addr}, {service.FieldDevice, s.Device},
			{service.FieldMount, s.Mount}, {service.FieldNamespace, s.EffectiveNamespace()}} {
			if k.value == "" || (k.field == service.FieldNamespace && !service.ValidID(s.ID) && s.Namespace == "") {
				continue
			}
			if j, dup := first[k]; dup {
				out = append(out, svcProblem{i, k.field, fmt.Errorf("%q is also the %s of services item %d: each service needs its own", k.value, k.field, j+1)})
				continue
			}
			first[k] = i
		}
	}
	return out
}

// servicesErrors formats problems; at gives the line of a problem (0:
// unknown). With a file, each error names it and the line.
func servicesErrors(specs []service.Spec, problems []svcProblem, file string, at func(svcProblem) int) []error {
	var errs []error
	for _, p := range problems {
		where := svcLabel(specs, p.index)
		if p.field != "" {
			where += ": " + p.field
		}
		msg := fmt.Sprintf("%s: %v", where, p.err)
		if l := at(p); l > 0 && file != "" {
			msg = fmt.Sprintf("config file %s: line %d: %s", file, l, msg)
		}
		errs = append(errs, errors.New(msg))
	}
	return errs
}

// loadServices reads the services: list of the file path. It returns the
// specs and where each was read, or every problem (each naming the file,
// the line and the field): a list with any problem is not applied.
func loadServices(path string, v *yaml.Node) ([]service.Spec, *serviceSource, error) {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	fail := func(line int, format string, a ...any) error {
		return fmt.Errorf("config file %s: line %d: %s: %s", path, line, ServicesKey, fmt.Sprintf(format, a...))
	}
	if v.Kind != yaml.SequenceNode {
		return nil, nil, fail(v.Line, "want a list of services (each a mapping: - id: ..., address: ..., interface: ...)")
	}
	if len(v.Content) == 0 {
		return nil, nil, fail(v.Line, "the list is empty: name at least one service, or leave services: out to serve one service with vip as before")
	}
	src := &serviceSource{file: path}
	specs := make([]service.Spec, len(v.Content))
	var errs []error
	for i, item := range v.Content {
		src.items = append(src.items, item.Line)
		src.keys = append(src.keys, map[string]int{})
		errs = append(errs, readService(path, i, item, &specs[i], src.keys[i])...)
		src.ids = append(src.ids, specs[i].ID)
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	if ps := serviceProblems(specs); len(ps) > 0 {
		return nil, nil, errors.Join(servicesErrors(specs, ps, path, func(p svcProblem) int { return src.line(p.index, specs[p.index].ID, p.field) })...)
	}
	return specs, src, nil
}

// readService fills s from the mapping item (service i of the list) and
// records each key's line in lines; it returns the problems of its shape
// (unknown or repeated keys, values of the wrong type or syntax).
func readService(path string, i int, item *yaml.Node, s *service.Spec, lines map[string]int) []error {
	where := fmt.Sprintf("services item %d", i+1)
	if item.Kind != yaml.MappingNode {
		return []error{fmt.Errorf("config file %s: line %d: %s: want a mapping (id: ..., address: ..., interface: ...)", path, item.Line, where)}
	}
	// The id first, so that every other error can name the service.
	for j := 0; j+1 < len(item.Content); j += 2 {
		if k, val := item.Content[j], item.Content[j+1]; k.Value == service.FieldID && val.Kind == yaml.ScalarNode && service.ValidID(val.Value) {
			where = fmt.Sprintf("service %q", val.Value)
		}
	}
	known := map[string]bool{}
	for _, f := range service.Fields() {
		known[f] = true
	}
	var errs []error
	for j := 0; j+1 < len(item.Content); j += 2 {
		k, val := item.Content[j], item.Content[j+1]
		key := k.Value
		err := func() error {
			if !known[key] {
				return fmt.Errorf("%q: %w (a service has %s)", key, ErrUnknownKey, strings.Join(service.Fields(), ", "))
			}
			if l, dup := lines[key]; dup {
				return fmt.Errorf("%s: given again (first on line %d)", key, l)
			}
			lines[key] = k.Line
			if err := setServiceField(s, key, val); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			return nil
		}()
		if err != nil {
			errs = append(errs, fmt.Errorf("config file %s: line %d: %s: %w", path, k.Line, where, err))
		}
	}
	return errs
}

// setServiceField parses the YAML value v into field key of s.
func setServiceField(s *service.Spec, key string, v *yaml.Node) error {
	switch key {
	case service.FieldExportClients, service.FieldPrefer:
		items, err := yamlList(v)
		if err != nil {
			return err
		}
		if key == service.FieldPrefer {
			s.Prefer = items
		} else {
			s.ExportClients = items
		}
		return nil
	}
	str, err := yamlValue("string", v)
	if err != nil {
		return err
	}
	str = strings.TrimSpace(str)
	switch key {
	case service.FieldID:
		s.ID = str
	case service.FieldAddress:
		p, err := netip.ParsePrefix(str)
		if err != nil {
			return fmt.Errorf("%q is not an address with its prefix length (like 10.0.0.50/24)", str)
		}
		s.Address = p
	case service.FieldInterface:
		s.Interface = str
	case service.FieldDevice:
		s.Device = str
	case service.FieldMount:
		s.Mount = str
	case service.FieldExportOptions:
		s.ExportOptions = str
	case service.FieldNamespace:
		s.Namespace = str
	case service.FieldGrace, service.FieldLease:
		d, err := time.ParseDuration(str)
		if str == "0" || str == "" {
			d, err = 0, nil
		}
		if err != nil {
			return fmt.Errorf("not a duration (like 90s or 2m; 0 for the node's default): %q", str)
		}
		if key == service.FieldGrace {
			s.Grace = d
		} else {
			s.Lease = d
		}
	}
	return nil
}

// yamlList is a list value: a YAML sequence of plain values, or one
// comma-separated string.
func yamlList(v *yaml.Node) ([]string, error) {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	var out []string
	if v.Kind == yaml.SequenceNode {
		for _, p := range v.Content {
			if p.Kind != yaml.ScalarNode || p.Tag == "!!null" {
				return nil, fmt.Errorf("%w: list item on line %d is not a plain value", errType, p.Line)
			}
			out = append(out, strings.TrimSpace(p.Value))
		}
		return out, nil
	}
	s, err := yamlValue("list", v)
	if err != nil {
		return nil, err
	}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out, nil
}

// Values of service_namespaces.
const (
	ServiceNamespacesAuto = "auto" // on exactly when services: is set and vip_mode is netlink
	ServiceNamespacesOn   = "on"
	ServiceNamespacesOff  = "off"
)

// Namespaced reports whether each service this node serves runs in a
// network namespace of its own (service_namespaces, resolved). A witness
// serves none.
func (c Config) Namespaced() bool {
	if c.Services == nil || c.VIPMode != VIPNetlink || c.Witness {
		return false
	}
	return c.ServiceNamespaces != ServiceNamespacesOff
}

// validateServices is Validate's part for services: the list itself, and
// how it fits the node's other keys. With services, the services carry
// the floating addresses: vip and vip_interface stay unset, and vip_mode
// and vip_bind apply to every service's address. A witness may carry the
// list (it serves none): keeping the list the same on every member lets
// the members compare it.
func (c *Config) validateServices(bad func(key, format string, a ...any)) {
	switch c.ServiceNamespaces {
	case ServiceNamespacesAuto, ServiceNamespacesOff:
	case ServiceNamespacesOn:
		if c.Services == nil || c.VIPMode != VIPNetlink {
			bad("service_namespaces", "on needs services: and vip_mode netlink (a service's namespace gets its address on a macvlan of the service's interface); use auto or off")
		}
	default:
		bad("service_namespaces", "%q is not one of auto, on, off", c.ServiceNamespaces)
	}
	if c.Services == nil {
		return
	}
	specs := c.Services
	var file string
	if c.servicesFrom != nil {
		file = c.servicesFrom.file
	}
	line := func(p svcProblem) int {
		if p.index < 0 {
			return 0
		}
		return c.servicesFrom.line(p.index, specs[p.index].ID, p.field)
	}
	ps := serviceProblems(specs)
	if len(specs) == 0 {
		ps = append(ps, svcProblem{-1, "", errors.New("the list is empty: name at least one service, or leave services out")})
	}
	vip, vipErr := netip.ParsePrefix(c.VIP)
	bind, _ := netip.ParseAddr(c.Bind)
	for i, s := range specs {
		a := s.Address.Addr()
		if !s.Address.IsValid() {
			continue
		}
		switch {
		case c.VIP != "" && vipErr == nil && vip.Addr() == a:
			ps = append(ps, svcProblem{i, service.FieldAddress, fmt.Errorf("%s is the vip's address: with services, vip is unset and each service carries its own address", a)})
		case bind.IsValid() && bind == a:
			ps = append(ps, svcProblem{i, service.FieldAddress, fmt.Errorf("%s is this node's bind address: a floating address moves between servers, the node's own must not", a)})
		case c.VIPMode == VIPLoopback && !a.IsLoopback():
			ps = append(ps, svcProblem{i, service.FieldAddress, fmt.Errorf("%s is not a loopback address, needed by vip_mode loopback", a)})
		case c.VIPBind == "process" && !a.Is4():
			ps = append(ps, svcProblem{i, service.FieldAddress, fmt.Errorf("%s is not IPv4, needed by vip_bind process", a)})
		}
	}
	for _, err := range servicesErrors(specs, ps, file, line) {
		bad(ServicesKey, "%v", err)
	}
	if c.VIP != "" {
		bad("vip", "%q is set beside services: each service carries its own floating address (its address:); leave vip unset", c.VIP)
	}
	if c.VIPInterface != "" {
		bad("vip_interface", "%q is set beside services: each service names its interface (its interface:); leave vip_interface unset", c.VIPInterface)
	}
}

// checkServicesEnv refuses NSMD_SERVICES: the list is a file-only key.
func checkServicesEnv(lookup func(string) (string, bool)) error {
	env := Field{Key: ServicesKey}.Env()
	if _, ok := lookup(env); ok {
		return fmt.Errorf("environment %s: %s", env, ServicesHelp)
	}
	return nil
}
