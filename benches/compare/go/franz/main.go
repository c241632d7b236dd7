// Command franz is twmb/franz-go's side of benches/compare: it produces or consumes with
// the same flags as kafkapipe's compare_peer and prints one JSON line.
//
//	franz produce --brokers B --topic T --count N --size S --compression lz4 --acks 1 --linger-ms 5
//	franz consume --brokers B --topic T --count N
//
// produce: kgo.Client.Produce with a promise per record (the client bounds buffered
// records itself), ProducerLinger = linger, ProducerBatchMaxBytes, then Flush. Idempotent
// writes are off: acks 0/1 require that, and for acks=all they are off in every client of
// the comparison (only franz-go and the Java client turn them on by default).
// consume: ConsumeTopics (no group) from the start, PollFetches until N records.
package main

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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
	codec := kgo.NoCompression()
	switch o.Compression {
	case "none", "":
	case "gzip":
		codec = kgo.GzipCompression()
	case "snappy":
		codec = kgo.SnappyCompression()
	case "lz4":
		codec = kgo.Lz4Compression()
	case "zstd":
		codec = kgo.ZstdCompression()
	default:
		bench.Fail("compression", errors.New(o.Compression))
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(o.Brokers, ",")...),
		kgo.DefaultProduceTopic(o.Topic),
		kgo.ProducerLinger(o.Linger),
		kgo.ProducerBatchMaxBytes(int32(o.BatchBytes)),
		kgo.ProducerBatchCompression(codec),
		kgo.DisableIdempotentWrite(),
	}
	switch o.Acks {
	case "0":
		opts = append(opts, kgo.RequiredAcks(kgo.NoAck()))
	case "1":
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()))
	default:
		opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		bench.Fail("client", err)
	}
	defer cl.Close()
	value := make([]byte, o.Size)
	for i := range value {
		value[i] = 'x'
	}
	var (
		acked    atomic.Int64
		firstErr atomic.Value
	)
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			firstErr.CompareAndSwap(nil, err)
		}
		acked.Add(1)
	}
	ctx := context.Background()
	start := time.Now()
	for i := 0; i < o.Count; i++ {
		cl.Produce(ctx, &kgo.Record{Value: value}, promise)
	}
	if err := cl.Flush(ctx); err != nil {
		bench.Fail("flush", err)
	}
	d := time.Since(start)
	if err, ok := firstErr.Load().(error); ok {
		bench.Fail("delivery", err)
	}
	if acked.Load() != int64(o.Count) {
		bench.Fail("delivery", errors.New("not every record was acknowledged"))
	}
	bench.Report("franz-go", o.Count, int64(o.Count)*int64(o.Size), d)
}

func consume(o bench.Opts) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(o.Brokers, ",")...),
		kgo.ConsumeTopics(o.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(500*time.Millisecond),
	)
	if err != nil {
		bench.Fail("client", err)
	}
	defer cl.Close()
	ctx := context.Background()
	var got int
	var bytes int64
	start := time.Now()
	for got < o.Count {
		fetches := cl.PollFetches(ctx)
		if errs := fetches.Errors(); len(errs) > 0 {
			bench.Fail("fetch", errs[0].Err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			got++
			bytes += int64(len(r.Key) + len(r.Value))
		})
	}
	d := time.Since(start)
	bench.Report("franz-go", got, bytes, d)
}
