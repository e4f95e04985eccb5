package k8s

import "testing"

func TestParseKey(t *testing.T) {
	tests := []struct {
		in      string
		want    Key
		wantErr bool
	}{
		{in: "shop/web", want: Key{Namespace: "shop", Name: "web"}},
		{in: "web", wantErr: true},
		{in: "/web", wantErr: true},
		{in: "shop/", wantErr: true},
		{in: "a/b/c", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseKey(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseKey(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
			if err == nil && got.String() != tt.in {
				t.Errorf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
}
