package wire

// The compound values of jscan: objects, with the fields a lean type names,
// arrays, and the []string and map[string]string of tags and meta.

// fields names the fields of one wire type, for object.
type fields []string

// object reads an object, calling field with the index in names of each
// key that names a field (its value is field's to consume) and skipping
// the others. A key that is not plain, names a field twice, or matches a
// field only case-insensitively (encoding/json would fill the field)
// marks the scan bad.
func (s *jscan) object(names fields, depth int, field func(k int)) {
	if depth > maxDepth || len(names) > 64 { // seen below has 64 bits
		s.bad = true
	}
	s.eat('{')
	if s.bad {
		return
	}
	if s.ws() == '}' {
		s.i++
		return
	}
	var seen uint64
	for !s.bad {
		key, ok := s.plain()
		if !ok {
			s.bad = true
			return
		}
		s.eat(':')
		k := names.find(key)
		switch {
		case k >= 0:
			if seen&(1<<k) != 0 {
				s.bad = true
				return
			}
			seen |= 1 << k
			field(k)
		case names.fold(key):
			s.bad = true
			return
		default:
			s.skip(depth + 1)
		}
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
}

func (f fields) find(key []byte) int {
	for i, n := range f {
		if n == string(key) {
			return i
		}
	}
	return -1
}

// fold reports whether key equals a name but for ASCII case (plain keys
// are ASCII, so this is encoding/json's case-insensitive match for them).
func (f fields) fold(key []byte) bool {
	for _, n := range f {
		if len(n) != len(key) {
			continue
		}
		same := true
		for i := range key {
			if lower(key[i]) != lower(n[i]) {
				same = false
				break
			}
		}
		if same {
			return true
		}
	}
	return false
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// array reads an array (not null), calling elem for each element.
func (s *jscan) array(depth int, elem func()) {
	if depth > maxDepth {
		s.bad = true
	}
	s.eat('[')
	if s.bad {
		return
	}
	if s.ws() == ']' {
		s.i++
		return
	}
	for !s.bad {
		elem()
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
}

// strings decodes a []string: null is nil, [] is empty but not nil (as
// encoding/json makes them); a null element marks the scan bad.
func (s *jscan) strings(depth int) []string {
	if s.null() {
		return nil
	}
	out := []string{}
	s.array(depth, func() {
		if s.ws() != '"' {
			s.bad = true
			return
		}
		out = append(out, s.istr())
	})
	return out
}

// strMap decodes a map[string]string: null is nil, {} is empty but not
// nil; a value that is not a string marks the scan bad. A key given twice
// keeps its last value, as in encoding/json.
func (s *jscan) strMap(depth int) map[string]string {
	if s.null() {
		return nil
	}
	if depth > maxDepth {
		s.bad = true
	}
	s.eat('{')
	out := map[string]string{}
	if s.bad {
		return nil
	}
	if s.ws() == '}' {
		s.i++
		return out
	}
	for !s.bad {
		if s.ws() != '"' {
			s.bad = true
			return nil
		}
		k := s.istr()
		s.eat(':')
		if s.ws() != '"' {
			s.bad = true
			return nil
		}
		out[k] = s.istr()
		switch s.ws() {
		case ',':
			s.i++
		case '}':
			s.i++
			return out
		default:
			s.bad = true
		}
	}
	return nil
}
