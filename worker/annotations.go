package worker

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
	maxNameLen      = 63
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

// ValidateServiceName reports why name cannot be a Consul service name
// (fleetsync requires a DNS label so the name resolves in Consul DNS).
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
