package sim

import (
	"context"
	"errors"
	"testing"

	"github.com/llmgw/llmgw/internal/testkit"
)

func testEngine(maxSeqs, blocks int) *engine {
	cfg := DefaultConfig()
	cfg.MaxNumSeqs, cfg.NumGPUBlocks, cfg.BlockSize = maxSeqs, blocks, 4
	return newEngine(&cfg, nil)
}

func TestEngineMaxNumSeqsQueueing(t *testing.T) {
	e := testEngine(2, 64)
	ctx := context.Background()
	s1, err1 := e.admit(ctx, nil, nil, 4, 4)
	s2, err2 := e.admit(ctx, nil, nil, 4, 4)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	admitted := make(chan *sequence, 2)
	for range 2 {
		go func() {
			s, err := e.admit(ctx, nil, nil, 4, 4)
			if err != nil {
				t.Error(err)
			}
			admitted <- s
		}()
	}
	testkit.Wait(t, "two waiting", func() bool { return e.stats().Waiting == 2 })
	if st := e.stats(); st.Running != 2 {
		t.Fatalf("running = %d, want 2", st.Running)
	}
	s1.release()
	s3 := <-admitted
	if st := e.stats(); st.Running != 2 || st.Waiting != 1 {
		t.Errorf("after one release: %+v, want 2 running 1 waiting", st)
	}
	s1.release() // a second release is a no-op
	s2.release()
	s4 := <-admitted
	s3.release()
	s4.release()
	if st := e.stats(); st.Running != 0 || st.Waiting != 0 || st.KVUsage != 0 {
		t.Errorf("idle engine: %+v", st)
	}
}

func TestEngineWaitsForBlocksFIFO(t *testing.T) {
	e := testEngine(8, 4)
	big, err := e.admit(context.Background(), nil, nil, 8, 4) // 3 of 4 blocks
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := e.admit(context.Background(), nil, nil, 4, 4) // needs 2
		if err != nil {
			t.Error(err)
			return
		}
		s.release()
	}()
	testkit.Wait(t, "the request to wait for blocks", func() bool { return e.stats().Waiting == 1 })
	big.release()
	<-done
}

func TestEngineCancelLeavesQueue(t *testing.T) {
	e := testEngine(1, 64)
	s1, err := e.admit(context.Background(), nil, nil, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.admit(ctx, nil, nil, 4, 4)
		errc <- err
	}()
	testkit.Wait(t, "one waiting", func() bool { return e.stats().Waiting == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if st := e.stats(); st.Waiting != 0 {
		t.Errorf("waiting = %d after cancel", st.Waiting)
	}
	s1.release()
	s, err := e.admit(context.Background(), nil, nil, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	s.release()
}
