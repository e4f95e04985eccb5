package worker

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fleetsync/fleetsync/k8s"
)

// Annotations read from a Service. The consul-k8s names are accepted as they
// are, so users switch without editing their Services; fleetsync's own
// additions live under FleetsyncPrefix.
const (
	ConsulPrefix     = "consul.hashicorp.com/"
	AnnotationSync   = ConsulPrefix + "service-sync"
	AnnotationName   = ConsulPrefix + "service-name"
	AnnotationPort   = ConsulPrefix + "service-port"
	AnnotationTags   = ConsulPrefix + "service-tags"
	AnnotationMeta   = ConsulPrefix + "service-meta-" // + key
	FleetsyncPrefix  = "fleetsync.io/"
	AnnotationWindow = FleetsyncPrefix + "window"
)

// Limits on annotation values (Consul's own limits where it has them).
const (
	maxNameLen      = 63  // a DNS label: what Consul DNS can look up
	maxConsulName   = 255 // what consul-k8s accepts in service-name
	maxTags         = 128
	maxTagLen       = 255
	maxMetaPairs    = 64 // Consul's limit, the mark's pairs included
	maxMetaKeyLen   = 128
	maxMetaValueLen = 512
	maxWindow       = time.Hour
)

// AnnotationError says which annotation of which Service cannot be used.
type AnnotationError struct {
	Service    string // namespace/name
	Annotation string
	Value      string // possibly truncated
	Reason     string
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("service %s: annotation %s=%q: %s", e.Service, e.Annotation, e.Value, e.Reason)
}

func annotationError(svc, key, value, reason string) *AnnotationError {
	if len(value) > 64 {
		value = value[:64] + "..."
	}
	if !utf8.ValidString(value) {
		value = strings.ToValidUTF8(value, "\uFFFD")
	}
	return &AnnotationError{Service: svc, Annotation: key, Value: value, Reason: reason}
}

var (
	dnsLabel = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$`)
	metaKey  = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
)

// ValidateServiceName reports why name cannot be looked up in Consul DNS
// (<name>.service.consul needs a DNS label): with --strict-annotations,
// why it cannot be a Consul service name.
func ValidateServiceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("must not be empty")
	case len(name) > maxNameLen:
		return fmt.Errorf("is %d characters long, at most %d allowed", len(name), maxNameLen)
	case !dnsLabel.MatchString(name):
		return fmt.Errorf("must be a DNS label: letters, digits and '-', starting and ending with a letter or digit")
	}
	return nil
}

// ValidateConsulServiceName reports why Consul cannot store name as
// consul-k8s would write it: 1-255 bytes of UTF-8 (Consul's JSON would
// replace invalid bytes, and the name read back would never match).
func ValidateConsulServiceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("must not be empty")
	case len(name) > maxConsulName:
		return fmt.Errorf("is %d characters long, at most %d allowed", len(name), maxConsulName)
	case !utf8.ValidString(name):
		return fmt.Errorf("is not valid UTF-8")
	}
	return nil
}

// serviceName is the Consul name of svc: its service-name annotation, else
// --service-prefix + metadata.name (+ -<namespace>). A name Consul can
// store but Consul DNS cannot look up is synced with a warning (as
// consul-k8s syncs it), or refused with cfg.StrictAnnotations.
func serviceName(svc *k8s.Service, cfg Config) (name, warning string, err error) {
	name = cfg.ServicePrefix + svc.Name
	if cfg.AddNamespaceSuffix {
		name += "-" + svc.Namespace
	}
	v, annotated := svc.Annotations[AnnotationName]
	if annotated {
		name = strings.TrimSpace(v)
	}
	nameErr := func(reason string) *AnnotationError {
		if annotated {
			return annotationError(svc.Key.String(), AnnotationName, v, reason)
		}
		return &AnnotationError{Service: svc.Key.String(), Annotation: "(none: name from --service-prefix and metadata.name)", Value: name, Reason: reason}
	}
	if err := ValidateConsulServiceName(name); err != nil {
		return "", "", nameErr("Consul service name " + err.Error())
	}
	if err := ValidateServiceName(name); err != nil {
		if cfg.StrictAnnotations {
			return "", "", nameErr("Consul service name " + err.Error() + " (--strict-annotations)")
		}
		return name, nameErr(fmt.Sprintf("Consul service name %s for Consul DNS: synced, but %s.service.consul does not resolve (the HTTP API and catalog queries work)", err, name)).Error(), nil
	}
	return name, "", nil
}

// portChoice resolves the service-port annotation against the Service spec
// to the name of the endpoint port (or a literal number). A port name the
// Service does not have falls back to its first port with a warning (as
// consul-k8s does), or is refused with cfg.StrictAnnotations.
func portChoice(svc *k8s.Service, cfg Config) (pc PortChoice, warning string, err error) {
	first := func() (PortChoice, error) {
		if len(svc.Ports) == 0 {
			return PortChoice{}, &AnnotationError{Service: svc.Key.String(), Annotation: "spec.ports", Value: "[]",
				Reason: "the Service has no ports; set " + AnnotationPort + " to a port number"}
		}
		return PortChoice{Name: svc.Ports[0].Name}, nil
	}
	v, ok := svc.Annotations[AnnotationPort]
	if !ok {
		pc, err = first()
		return pc, "", err
	}
	if pc, err = ParsePort(v); err != nil {
		return pc, "", annotationError(svc.Key.String(), AnnotationPort, v, err.Error())
	}
	if pc.Name == "" || hasPortName(svc.Ports, pc.Name) {
		return pc, "", nil
	}
	if cfg.StrictAnnotations || len(svc.Ports) == 0 {
		return pc, "", annotationError(svc.Key.String(), AnnotationPort, v, fmt.Sprintf("no port named %q in spec.ports", pc.Name))
	}
	pc, _ = first()
	return pc, annotationError(svc.Key.String(), AnnotationPort, v, fmt.Sprintf("no port named %q in spec.ports: using the first port, %s", v, portLabel(svc.Ports[0]))).Error(), nil
}

// portLabel names a spec.ports entry for a message: its name, else its port.
func portLabel(p k8s.Port) string {
	if p.Name != "" {
		return fmt.Sprintf("%q", p.Name)
	}
	return fmt.Sprintf("port %d", p.Port)
}

func hasPortName(ports []k8s.Port, name string) bool {
	for _, p := range ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// ParseTags splits a consul-k8s service-tags value: comma-separated, `\,`
// escapes a comma, surrounding spaces trimmed, empty tags dropped.
func ParseTags(value string) ([]string, error) {
	if !utf8.ValidString(value) {
		return nil, fmt.Errorf("is not valid UTF-8")
	}
	var tags []string
	var cur strings.Builder
	flush := func() {
		if t := strings.TrimSpace(cur.String()); t != "" {
			tags = append(tags, t)
		}
		cur.Reset()
	}
	for i := 0; i < len(value); i++ {
		switch {
		case value[i] == '\\' && i+1 < len(value) && value[i+1] == ',':
			cur.WriteByte(',')
			i++
		case value[i] == ',':
			flush()
		default:
			cur.WriteByte(value[i])
		}
	}
	flush()
	if len(tags) > maxTags {
		return nil, fmt.Errorf("has %d tags, at most %d allowed", len(tags), maxTags)
	}
	for _, t := range tags {
		if len(t) > maxTagLen {
			return nil, fmt.Errorf("tag %q... is %d bytes long, at most %d allowed", t[:16], len(t), maxTagLen)
		}
	}
	return tags, nil
}

// ValidateMeta reports why key=value cannot be user service meta.
func ValidateMeta(key, value string, reserved map[string]bool) error {
	switch {
	case len(key) > maxMetaKeyLen:
		return fmt.Errorf("meta key is %d characters long, at most %d allowed", len(key), maxMetaKeyLen)
	case !metaKey.MatchString(key):
		return fmt.Errorf("meta key %q may only contain letters, digits, '-' and '_'", key)
	case strings.HasPrefix(key, "consul-"):
		return fmt.Errorf("meta key %q: the prefix consul- is reserved by Consul", key)
	case reserved[key]:
		return fmt.Errorf("meta key %q is set by fleetsync and cannot be overridden", key)
	case len(value) > maxMetaValueLen:
		return fmt.Errorf("meta value is %d characters long, at most %d allowed", len(value), maxMetaValueLen)
	case !utf8.ValidString(value):
		return fmt.Errorf("meta value is not valid UTF-8")
	}
	return nil
}

// PortChoice is the parsed service-port annotation.
type PortChoice struct {
	Name   string // a port name, or
	Number int    // a literal port number; both zero: the Service's first port
}

// ParsePort parses a service-port value: a port number (1-65535) or a name.
func ParsePort(value string) (PortChoice, error) {
	value = strings.TrimSpace(value)
	if value == "" {
		return PortChoice{}, fmt.Errorf("must not be empty")
	}
	if n, err := strconv.Atoi(value); err == nil || errors.Is(err, strconv.ErrRange) {
		if err != nil || n < 1 || n > 65535 {
			return PortChoice{}, fmt.Errorf("port number %s is out of range 1-65535", value)
		}
		return PortChoice{Number: n}, nil
	}
	if len(value) > 63 || !dnsLabel.MatchString(value) {
		return PortChoice{}, fmt.Errorf("is neither a port number nor a valid port name")
	}
	return PortChoice{Name: value}, nil
}

// ParseWindow parses the fleetsync.io/window value: a Go duration between 0
// and one hour.
func ParseWindow(value string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(value))
	if err != nil {
		return 0, fmt.Errorf("is not a Go duration (like 500ms, 1s, 2m)")
	}
	if d < 0 || d > maxWindow {
		return 0, fmt.Errorf("must be between 0 and %s", maxWindow)
	}
	return d, nil
}

// appendNonEmpty appends msg to msgs unless it is empty.
func appendNonEmpty(msgs []string, msg string) []string {
	if msg == "" {
		return msgs
	}
	return append(msgs, msg)
}
