// kvev-consumer: a consumer of vLLM-format KV cache events that decodes each payload with llm-d's
// own vLLM adapter (github.com/llm-d/llm-d-kv-cache v0.9.0,
// pkg/kvevents/engineadapter.VLLMAdapter.ParseMessage), for rngd-pd's wire-format test. Prints one
// JSON line per message; block hashes as decimal strings (JavaScript numbers hold 53 bits).
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	zmq4 "github.com/go-zeromq/zmq4"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
)

const endSeq = ^uint64(0) // 0xFFFFFFFFFFFFFFFF: replay end marker

type jsonEvent struct {
	Type      string   `json:"type"`
	Hashes    []string `json:"hashes,omitempty"`
	Parent    *string  `json:"parent,omitempty"`
	Tokens    []uint32 `json:"tokens,omitempty"`
	BlockSize *int     `json:"blockSize,omitempty"`
	Medium    *string  `json:"medium,omitempty"`
}

type jsonLine struct {
	Topic  string      `json:"topic"`
	Pod    string      `json:"pod"`
	Model  string      `json:"model"`
	Seq    uint64      `json:"seq"`
	TS     float64     `json:"ts"`
	Events []jsonEvent `json:"events"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kvev-consumer: "+format+"\n", args...)
	os.Exit(1)
}

func decimal(xs []uint64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = strconv.FormatUint(x, 10)
	}
	return out
}

func toJSONEvent(ev kvevents.GenericEvent) (jsonEvent, error) {
	switch e := ev.(type) {
	case *kvevents.BlockStoredEvent:
		parent, bs, medium := strconv.FormatUint(e.ParentHash, 10), e.BlockSize, e.DeviceTier
		hashes, tokens := decimal(e.BlockHashes), e.Tokens
		if tokens == nil {
			tokens = []uint32{}
		}
		return jsonEvent{Type: string(e.Type()), Hashes: hashes, Parent: &parent,
			Tokens: tokens, BlockSize: &bs, Medium: &medium}, nil
	case *kvevents.BlockRemovedEvent:
		medium := e.DeviceTier
		return jsonEvent{Type: string(e.Type()), Hashes: decimal(e.BlockHashes), Medium: &medium}, nil
	case *kvevents.AllBlocksClearedEvent:
		return jsonEvent{Type: string(e.Type())}, nil
	default:
		return jsonEvent{}, fmt.Errorf("unexpected event type %T", ev)
	}
}

// handle decodes one message with llm-d's adapter and prints one JSON line.
func handle(adapter *engineadapter.VLLMAdapter, enc *json.Encoder, topic string, seqFrame, payload []byte) error {
	if len(seqFrame) != 8 {
		return fmt.Errorf("topic %q: sequence frame is %d bytes, want 8", topic, len(seqFrame))
	}
	seq := binary.BigEndian.Uint64(seqFrame)
	raw := &kvevents.RawMessage{Topic: topic, Sequence: seq, Payload: payload}
	pod, model, batch, err := adapter.ParseMessage(raw)
	if err != nil {
		return fmt.Errorf("decode error (topic %q, seq %d): %w", topic, seq, err)
	}
	line := jsonLine{Topic: topic, Pod: pod, Model: model, Seq: seq, TS: batch.Timestamp,
		Events: make([]jsonEvent, 0, len(batch.Events))}
	for _, ev := range batch.Events {
		je, err := toJSONEvent(ev)
		if err != nil {
			return fmt.Errorf("seq %d: %w", seq, err)
		}
		line.Events = append(line.Events, je)
	}
	return enc.Encode(line)
}

// recvWithTimeout runs sock.Recv in a goroutine so a silent peer cannot block forever.
func recvWithTimeout(sock zmq4.Socket, d time.Duration) (zmq4.Msg, error) {
	type result struct {
		msg zmq4.Msg
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := sock.Recv()
		ch <- result{m, err}
	}()
	select {
	case r := <-ch:
		return r.msg, r.err
	case <-time.After(d):
		return zmq4.Msg{}, fmt.Errorf("timeout: no message within %s", d)
	}
}

func main() {
	endpoint := flag.String("endpoint", "", "live PUB endpoint to dial, e.g. tcp://127.0.0.1:5557")
	prefix := flag.String("topic-prefix", "kv@", "SUB topic prefix")
	count := flag.Int("count", 1, "number of messages to read")
	replay := flag.String("replay", "", "replay ROUTER endpoint to dial (enables replay mode)")
	from := flag.Uint64("from", 0, "replay start sequence")
	timeout := flag.Duration("timeout", 10*time.Second, "per-message receive timeout")
	flag.Parse()

	if *replay == "" && *endpoint == "" {
		fail("-endpoint (live) or -replay (replay) is required")
	}
	if *count <= 0 {
		fail("-count must be > 0")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	adapter := engineadapter.NewVLLMAdapter()
	enc := json.NewEncoder(os.Stdout)
	// Dial retries up to the timeout, so starting before the publisher is fine.
	retry := 100 * time.Millisecond
	maxRetries := int(*timeout / retry)
	opts := []zmq4.Option{zmq4.WithDialerRetry(retry), zmq4.WithDialerMaxRetries(maxRetries), zmq4.WithTimeout(*timeout)}

	if *replay != "" {
		sock := zmq4.NewDealer(ctx, opts...)
		defer sock.Close()
		if err := sock.Dial(*replay); err != nil {
			fail("dial replay %s (gave up after %s): %v", *replay, *timeout, err)
		}
		req := make([]byte, 8)
		binary.BigEndian.PutUint64(req, *from)
		if err := sock.SendMulti(zmq4.NewMsgFrom([]byte{}, req)); err != nil {
			fail("send replay request: %v", err)
		}
		for n := 0; n < *count; {
			msg, err := recvWithTimeout(sock, *timeout)
			if err != nil {
				fail("replay recv: %v", err)
			}
			f := msg.Frames
			if len(f) != 4 || len(f[0]) != 0 {
				fail("replay reply: want 4 frames [empty, topic, seq, payload], got %d", len(f))
			}
			if len(f[2]) == 8 && binary.BigEndian.Uint64(f[2]) == endSeq && len(f[3]) == 0 {
				fmt.Fprintf(os.Stderr, "kvev-consumer: replay end marker after %d message(s)\n", n)
				return
			}
			if err := handle(adapter, enc, string(f[1]), f[2], f[3]); err != nil {
				fail("%v", err)
			}
			n++
		}
		return
	}

	sock := zmq4.NewSub(ctx, opts...)
	defer sock.Close()
	if err := sock.Dial(*endpoint); err != nil {
		fail("dial %s (gave up after %s): %v", *endpoint, *timeout, err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, *prefix); err != nil {
		fail("subscribe %q: %v", *prefix, err)
	}
	for n := 0; n < *count; n++ {
		msg, err := recvWithTimeout(sock, *timeout)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				fail("recv: socket closed")
			}
			fail("recv: %v", err)
		}
		f := msg.Frames
		if len(f) != 3 {
			fail("live message: want 3 frames [topic, seq, payload], got %d", len(f))
		}
		if !bytes.HasPrefix(f[0], []byte(*prefix)) {
			fail("live message: topic %q does not match prefix %q", f[0], *prefix)
		}
		if err := handle(adapter, enc, string(f[0]), f[1], f[2]); err != nil {
			fail("%v", err)
		}
	}
}
