package hostcheck

import (
	"net/netip"
	"strings"
	"testing"
)

func TestHost(t *testing.T) {
	tests := []struct {
		host string
		why  string // substring; "" = allowed
	}{
		{"10.0.0.7", ""},
		{"127.0.0.1", ""},
		{"::1", ""},
		{"engine.invalid", ""},
		{"169.254.169.254", "link-local"},
		{"fe80::a9fe:a9fe", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"::ffff:169.254.169.254", "link-local"},
		{"ff02::1", "link-local"},
		{"100.100.100.200", "Alibaba"},
		{"fd00:ec2::254", "EC2"},
		{"metadata.google.internal", "GCE"},
		{"Metadata.Google.Internal.", "GCE"},
		{"instance-data", "EC2"},
		{"2852039166", "dotted-quad"},
		{"0xa9fea9fe", "dotted-quad"},
		{"169.254.43518", "dotted-quad"},
		{"a.b.123", "dotted-quad"},
	}
	for _, tt := range tests {
		got := Host(tt.host)
		if (tt.why == "") != (got == "") || !strings.Contains(got, tt.why) {
			t.Errorf("Host(%q) = %q, want %q", tt.host, got, tt.why)
		}
	}
}

func TestAddr(t *testing.T) {
	tests := []struct {
		addr string
		why  string
	}{
		{"10.0.0.7", ""},
		{"127.0.0.2", ""},
		{"192.168.1.1", ""},
		{"169.254.0.1", "link-local"},
		{"::ffff:169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"100.100.100.200", "Alibaba"},
		{"::ffff:100.100.100.200", "Alibaba"},
		{"fd00:ec2::254", "EC2"},
	}
	for _, tt := range tests {
		got := Addr(netip.MustParseAddr(tt.addr))
		if (tt.why == "") != (got == "") || !strings.Contains(got, tt.why) {
			t.Errorf("Addr(%s) = %q, want %q", tt.addr, got, tt.why)
		}
	}
}

func TestParseAllow(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"10.0.0.7", "10.0.0.7/32", ""},
		{"10.0.0.0/24", "10.0.0.0/24", ""},
		{"::1", "::1/128", ""},
		{"::ffff:10.0.0.7", "10.0.0.7/32", ""},
		{"fd00::/8", "fd00::/8", ""},
		{"10.0.0.1/24", "", "write 10.0.0.0/24"},
		{"engine.example", "", "address or a CIDR prefix"},
		{"fe80::1%eth0", "", "address or a CIDR prefix"},
		{"", "", "address or a CIDR prefix"},
	} {
		p, err := ParseAllow(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseAllow(%q) = %v, %v; want an error with %q", tc.in, p, err, tc.err)
			}
			continue
		}
		if err != nil || p.String() != tc.want {
			t.Errorf("ParseAllow(%q) = %v, %v; want %s", tc.in, p, err, tc.want)
		}
	}
}
