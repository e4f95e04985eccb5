package k8s

import (
	"errors"
	"net/netip"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// parseAddress returns the canonical form of raw, which must be an IP of
// the slice's address family, without an IPv6 zone.
func parseAddress(raw string, family discoveryv1.AddressType) (string, error) {
	addr, err := netip.ParseAddr(raw)
	switch {
	case err != nil:
		return "", errors.New("not an IP address")
	case addr.Zone() != "":
		return "", errors.New("IPv6 zones are not supported")
	case family == discoveryv1.AddressTypeIPv4 && !addr.Is4():
		return "", errors.New("not an IPv4 address in an IPv4 slice")
	case family == discoveryv1.AddressTypeIPv6 && !addr.Is6():
		return "", errors.New("not an IPv6 address in an IPv6 slice")
	}
	return addr.String(), nil
}
