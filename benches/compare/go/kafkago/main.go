// Command kafkago is segmentio/kafka-go's side of benches/compare: it produces or consumes
// with the same flags as kafkapipe's compare_peer and prints one JSON line.
//
//	kafkago produce --brokers B --topic T --count N --size S --compression lz4 --acks 1 --linger-ms 5
//	kafkago consume --brokers B --topic T --count N --partitions P
//
// produce: an asynchronous kafka.Writer (BatchTimeout = linger, BatchBytes, BatchSize) fed
// in slices of 1000 messages, with at most 32 MiB of values unacknowledged (kafka-go's
// async mode has no bound of its own); every Completion is counted and Close flushes.
// consume: one kafka.Reader per partition (no group) from the first offset, until N
// messages were read in total.
package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"kafkapipe.bench/compare/internal/bench"
)

func main() {
	o := bench.Parse()
	switch o.Mode {
	case "produce":
		produce(o)
	case "consume":
		consume(o)
	default:
		bench.Fail("mode", errors.New("want produce or consume"))
	}
}

func produce(o bench.Opts) {
	var codec kafka.Compression
	switch o.Compression {
	case "none", "":
	case "gzip":
		codec = kafka.Gzip
	case "snappy":
		codec = kafka.Snappy
	case "lz4":
		codec = kafka.Lz4
	case "zstd":
		codec = kafka.Zstd
	default:
		bench.Fail("compression", errors.New(o.Compression))
	}
	acks := kafka.RequireAll
	switch o.Acks {
	case "0":
		acks = kafka.RequireNone
	case "1":
		acks = kafka.RequireOne
	}

	const maxUnacked = 32 << 20
	var (
		mu       sync.Mutex
		space    = sync.NewCond(&mu)
		unacked  int64
		acked    int64
		firstErr atomic.Value
	)
	w := &kafka.Writer{
		Addr:         kafka.TCP(strings.Split(o.Brokers, ",")...),
		Topic:        o.Topic,
		BatchSize:    o.BatchMsgs,
		BatchBytes:   int64(o.BatchBytes),
		BatchTimeout: o.Linger,
		RequiredAcks: acks,
		Compression:  codec,
		Async:        true,
		Completion: func(msgs []kafka.Message, err error) {
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
			var n int64
			for i := range msgs {
				n += int64(len(msgs[i].Value))
			}
			mu.Lock()
			unacked -= n
			acked += int64(len(msgs))
			space.Broadcast()
			mu.Unlock()
		},
	}
	value := make([]byte, o.Size)
	for i := range value {
		value[i] = 'x'
	}
	const chunk = 1000
	ctx := context.Background()
	start := time.Now()
	for sent := 0; sent < o.Count; {
		n := min(chunk, o.Count-sent)
		mu.Lock()
		for unacked > maxUnacked {
			space.Wait()
		}
		unacked += int64(n * o.Size)
		mu.Unlock()
		// A fresh slice each time: the writer keeps the messages until they are written.
		batch := make([]kafka.Message, n)
		for i := range batch {
			batch[i].Value = value
		}
		if err := w.WriteMessages(ctx, batch...); err != nil {
			bench.Fail("write", err)
		}
		sent += n
	}
	if err := w.Close(); err != nil {
		bench.Fail("close", err)
	}
	d := time.Since(start)
	if err, ok := firstErr.Load().(error); ok {
		bench.Fail("delivery", err)
	}
	if acked != int64(o.Count) {
		bench.Fail("delivery", errors.New("not every message was acknowledged"))
	}
	bench.Report("kafka-go", o.Count, int64(o.Count)*int64(o.Size), d)
}

func consume(o bench.Opts) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		got   atomic.Int64
		bytes atomic.Int64
		wg    sync.WaitGroup
		errs  = make(chan error, o.Partitions)
	)
	start := time.Now()
	for p := 0; p < o.Partitions; p++ {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:     strings.Split(o.Brokers, ","),
			Topic:       o.Topic,
			Partition:   p,
			MinBytes:    1,
			MaxBytes:    1 << 20,
			MaxWait:     500 * time.Millisecond,
			StartOffset: kafka.FirstOffset,
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			var n, b int64
			defer func() { bytes.Add(b) }()
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
						cancel()
					}
					return
				}
				n++
				b += int64(len(m.Key) + len(m.Value))
				if got.Add(1) >= int64(o.Count) {
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	select {
	case err := <-errs:
		bench.Fail("read", err)
	default:
	}
	bench.Report("kafka-go", int(got.Load()), bytes.Load(), d)
}
