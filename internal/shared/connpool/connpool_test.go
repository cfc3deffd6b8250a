package connpool

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// TestOneConnectionPerAddress: an address is dialled once and its
// connection shared until Close, after which it is dialled again; a dial
// error names the address; ResetBackoff leaves an idle connection and an
// unknown address alone, and no unknown address is ready.
func TestOneConnectionPerAddress(t *testing.T) {
	dials := map[string]int{}
	p := New(func(addr string) (*grpc.ClientConn, error) {
		dials[addr]++
		if addr == "bad:1" {
			return nil, errors.New("no route")
		}
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	})
	first, err := p.Get("a:1")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := p.Get("a:1")
	other, _ := p.Get("b:1")
	if again != first || other == first {
		t.Errorf("a:1 twice gave %p and %p, b:1 %p: want one connection per address", first, again, other)
	}
	if _, err := p.Get("bad:1"); err == nil || err.Error() != "connect to bad:1: no route" {
		t.Errorf("a failed dial: %v, want it to name the address", err)
	}
	if !p.Holds("a:1") || p.Holds("unknown:1") {
		t.Errorf("Holds: a:1 %v, unknown:1 %v; want only a:1 held", p.Holds("a:1"), p.Holds("unknown:1"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if p.AwaitReady(ctx, "unknown:1") {
		t.Error("an address the pool holds no connection to is ready")
	}
	cancel()
	p.ResetBackoff("a:1")
	p.ResetBackoff("unknown:1")
	if s := first.GetState(); s != connectivity.Idle {
		t.Errorf("an idle connection after ResetBackoff is %v, want it left idle", s)
	}
	p.Close()
	if s := first.GetState(); s != connectivity.Shutdown {
		t.Errorf("after Close the connection is %v, want Shutdown", s)
	}
	if _, err := p.Get("a:1"); err != nil {
		t.Fatal(err)
	}
	if dials["a:1"] != 2 || dials["b:1"] != 1 {
		t.Errorf("dials %v: want a:1 twice (before and after Close), b:1 once", dials)
	}
	p.Close()
}
