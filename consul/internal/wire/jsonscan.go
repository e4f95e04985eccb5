package wire

import (
	"encoding/json"
	"strconv"
)

// jscan is a one-pass JSON reader for the answers of the reads of owned
// state and of transactions (wiredecode.go). It gives what encoding/json
// gives for the documents Consul writes, or gives up: anything it does
// not decode exactly as encoding/json would (an escaped key, a key that
// matches a field only case-insensitively, a duplicate field, a value of
// an unexpected type, a number that is not a plain integer, nesting past
// maxDepth, invalid JSON anywhere, skipped parts included) sets bad, and
// the caller then decodes the whole document with encoding/json instead.
// Strings without escapes or non-ASCII bytes are taken as they are; any
// other string goes through encoding/json on its own, so escapes and
// invalid UTF-8 come out as encoding/json makes them.
type jscan struct {
	b   []byte
	i   int
	bad bool
	// strs interns the short strings of one answer that repeat across
	// its instances (service names, meta keys and most values, tags,
	// check statuses; istr): fewer allocations for the collector, as
	// worker.Held interns what it keeps.
	strs map[string]string
}

const (
	maxDepth    = 64   // deeper documents go to encoding/json
	maxInterned = 4096 // strings interned per answer
	internLen   = 64   // longer strings are not interned
)

func newScan(b []byte) *jscan { return &jscan{b: b} }

// ws skips white space and returns the next byte (0 at the end).
func (s *jscan) ws() byte {
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return c
		}
	}
	return 0
}

// end reports whether nothing but white space is left (ws also returns 0
// at a NUL byte, which is not the end).
func (s *jscan) end() bool {
	s.ws()
	return s.i == len(s.b) && !s.bad
}

// eat consumes c after white space, or marks the scan bad.
func (s *jscan) eat(c byte) {
	if s.ws() != c {
		s.bad = true
		return
	}
	s.i++
}

// null consumes a null after white space and reports whether it did.
func (s *jscan) null() bool {
	if s.ws() == 'n' && s.lit("null") {
		return true
	}
	return false
}

func (s *jscan) lit(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return false
	}
	s.i += len(word)
	return true
}

// strEnd returns the index after the string token that starts at i (a
// quote), checking its escapes and control characters as encoding/json
// does; -1 when it is not valid.
func (s *jscan) strEnd(i int) int {
	b := s.b
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return -1
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// plain returns the bytes of the string token at the scan position when
// it is plain (printable ASCII, no escapes) and consumes it; ok is false,
// with nothing consumed, when it is not a plain string.
func (s *jscan) plain() (raw []byte, ok bool) {
	if s.ws() != '"' {
		return nil, false
	}
	b := s.b
	for j := s.i + 1; j < len(b); j++ {
		c := b[j]
		if c == '"' {
			raw = b[s.i+1 : j]
			s.i = j + 1
			return raw, true
		}
		if c == '\\' || c < 0x20 || c >= 0x80 {
			return nil, false
		}
	}
	return nil, false
}

// str decodes a string value (not null).
func (s *jscan) str() string { return s.strIn(false) }

// istr decodes a string value (not null) that is likely to repeat in the
// answer, interned.
func (s *jscan) istr() string { return s.strIn(true) }

func (s *jscan) strIn(intern bool) string {
	if s.bad {
		return ""
	}
	if raw, ok := s.plain(); ok {
		if !intern {
			return string(raw)
		}
		return s.intern(raw)
	}
	if s.ws() != '"' {
		s.bad = true
		return ""
	}
	e := s.strEnd(s.i)
	if e < 0 {
		s.bad = true
		return ""
	}
	var out string
	if err := json.Unmarshal(s.b[s.i:e], &out); err != nil {
		s.bad = true
		return ""
	}
	s.i = e
	return out
}

func (s *jscan) intern(raw []byte) string {
	if len(raw) > internLen {
		return string(raw)
	}
	if v, ok := s.strs[string(raw)]; ok {
		return v
	}
	v := string(raw)
	if s.strs == nil {
		s.strs = make(map[string]string, 16)
	}
	if len(s.strs) < maxInterned {
		s.strs[v] = v
	}
	return v
}

// number consumes a number token, checking its grammar, and returns it.
func (s *jscan) number() []byte {
	b, start, i := s.b, s.i, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		s.bad = true
		return nil
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.bad = true
			return nil
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.bad = true
			return nil
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	s.i = i
	return b[start:i]
}

// uint decodes a uint64 value: digits only, as strconv.ParseUint reads
// them (encoding/json rejects a fraction or an exponent for an integer).
func (s *jscan) uint() uint64 {
	c := s.ws()
	if s.bad || c < '0' || c > '9' {
		s.bad = true
		return 0
	}
	n, err := strconv.ParseUint(string(s.number()), 10, 64)
	if err != nil {
		s.bad = true
	}
	return n
}

// int decodes an int value.
func (s *jscan) int() int {
	c := s.ws()
	if s.bad || (c != '-' && (c < '0' || c > '9')) {
		s.bad = true
		return 0
	}
	n, err := strconv.ParseInt(string(s.number()), 10, strconv.IntSize)
	if err != nil {
		s.bad = true
	}
	return int(n)
}

// skip consumes any value, checking it is valid JSON.
func (s *jscan) skip(depth int) {
	if s.bad {
		return
	}
	if depth > maxDepth {
		s.bad = true
		return
	}
	switch c := s.ws(); c {
	case '"':
		e := s.strEnd(s.i)
		if e < 0 {
			s.bad = true
			return
		}
		s.i = e
	case '{':
		s.i++
		if s.ws() == '}' {
			s.i++
			return
		}
		for !s.bad {
			if s.ws() != '"' {
				s.bad = true
				return
			}
			s.skip(depth + 1) // the key
			s.eat(':')
			s.skip(depth + 1)
			switch s.ws() {
			case ',':
				s.i++
			case '}':
				s.i++
				return
			default:
				s.bad = true
			}
		}
	case '[':
		s.i++
		if s.ws() == ']' {
			s.i++
			return
		}
		for !s.bad {
			s.skip(depth + 1)
			switch s.ws() {
			case ',':
				s.i++
			case ']':
				s.i++
				return
			default:
				s.bad = true
			}
		}
	case 't':
		s.bad = !s.lit("true")
	case 'f':
		s.bad = !s.lit("false")
	case 'n':
		s.bad = !s.lit("null")
	default:
		if c == '-' || '0' <= c && c <= '9' {
			s.number()
			return
		}
		s.bad = true
	}
}
