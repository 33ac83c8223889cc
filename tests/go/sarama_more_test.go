package spatego

// More of sarama: a SyncProducer per codec, records with their own timestamps, read
// back by sarama's partition Consumer; GetOffset by timestamp; a consumer group of two
// members with the sticky strategy that splits the partitions.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestSaramaCodecsPartitionConsumer: none, gzip, snappy, lz4 and zstd batches from
// sarama's SyncProducer; every record read back by partition consumers with its key,
// value, header and timestamp; GetOffset by timestamp lands on the record.
func TestSaramaCodecsPartitionConsumer(t *testing.T) {
	e := loadEnv(t)
	cfg := saramaConfig(e)
	admin, err := sarama.NewClusterAdmin(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewClusterAdmin: %v", err)
	}
	defer admin.Close()
	topic := uniqueName("sarama-codecs")
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: saramaPartitions, ReplicationFactor: e.replicationFactor}, false); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	saramaWaitTopic(t, e, topic, saramaPartitions)

	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	tsOf := func(seq int) time.Time { return base.Add(time.Duration(seq) * 10 * time.Millisecond) }
	const perCodec = 300
	var acks []produced
	seq := 0
	for _, codec := range []sarama.CompressionCodec{sarama.CompressionNone, sarama.CompressionGZIP,
		sarama.CompressionSnappy, sarama.CompressionLZ4, sarama.CompressionZSTD} {
		pcfg := saramaConfig(e)
		pcfg.Producer.Return.Successes = true
		pcfg.Producer.Compression = codec
		sp, err := sarama.NewSyncProducer(e.bootstrap, pcfg)
		if err != nil {
			t.Fatalf("NewSyncProducer (%v): %v", codec, err)
		}
		var msgs []*sarama.ProducerMessage
		for i := 0; i < perCodec; i++ {
			m := saramaMessage(topic, seq+i)
			m.Timestamp = tsOf(seq + i)
			msgs = append(msgs, m)
		}
		if err := sp.SendMessages(msgs); err != nil {
			t.Fatalf("SendMessages (%v): %v", codec, err)
		}
		for _, m := range msgs {
			acks = append(acks, ackOf(m))
		}
		if err := sp.Close(); err != nil {
			t.Fatalf("closing the SyncProducer: %v", err)
		}
		seq += perCodec
	}
	byPart, ends := checkAcks(t, acks, saramaPartitions)

	consumer, err := sarama.NewConsumer(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	defer consumer.Close()
	for p := int32(0); p < saramaPartitions; p++ {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("ConsumePartition %d: %v", p, err)
		}
		for o := int64(0); o < ends[p]; o++ {
			select {
			case m := <-pc.Messages():
				want := byPart[p][o]
				var hseq string
				if len(m.Headers) == 1 {
					hseq = string(m.Headers[0].Value)
				}
				if m.Offset != o || string(m.Key) != want.key || string(m.Value) != want.value ||
					!m.Timestamp.Equal(tsOf(want.seq)) || hseq != fmt.Sprint(want.seq) {
					t.Fatalf("partition %d: read offset %d key %q value %q ts %v seq %q; want offset %d %q %q ts %v seq %d",
						p, m.Offset, m.Key, m.Value, m.Timestamp, hseq, o, want.key, want.value, tsOf(want.seq), want.seq)
				}
			case err := <-pc.Errors():
				t.Fatalf("partition %d: %v", p, err)
			case <-time.After(30 * time.Second):
				t.Fatalf("partition %d: offset %d not read within 30s (end %d)", p, o, ends[p])
			}
		}
		pc.Close()
	}

	client, err := sarama.NewClient(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	defer client.Close()
	for _, s := range []int{0, 450, 777, 1234, len(acks) - 1} {
		for p := int32(0); p < saramaPartitions; p++ {
			want := int64(-1)
			for o := int64(0); o < ends[p]; o++ {
				if byPart[p][o].seq >= s {
					want = o
					break
				}
			}
			if want < 0 {
				continue // no record at or after it here: Kafka answers -1 (and sarama returns that)
			}
			got, err := client.GetOffset(topic, p, tsOf(s).UnixMilli())
			if err != nil || got != want {
				t.Fatalf("GetOffset(record %d's timestamp) on partition %d: %d %v, want %d", s, p, got, err, want)
			}
		}
	}
}

type countingHandler struct {
	mu     sync.Mutex
	claims map[int32]bool
	read   map[int32]map[int64]bool
	ready  chan struct{}
	once   sync.Once
}

func (h *countingHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claims = map[int32]bool{}
	for _, ps := range s.Claims() {
		for _, p := range ps {
			h.claims[p] = true
		}
	}
	return nil
}
func (h *countingHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *countingHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		h.mu.Lock()
		if h.read[m.Partition] == nil {
			h.read[m.Partition] = map[int64]bool{}
		}
		h.read[m.Partition][m.Offset] = true
		h.mu.Unlock()
		s.MarkMessage(m, "")
	}
	return nil
}

// TestSaramaTwoMemberGroup: two sarama members with the sticky strategy split four
// partitions two and two; together they read every record (a member may read again
// what the other read before the split, never miss one), and the committed offsets end
// at the log end offsets.
func TestSaramaTwoMemberGroup(t *testing.T) {
	e := loadEnv(t)
	cfg := saramaConfig(e)
	cfg.Producer.Return.Successes = true
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategySticky()}
	admin, err := sarama.NewClusterAdmin(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewClusterAdmin: %v", err)
	}
	defer admin.Close()
	topic := uniqueName("sarama-two")
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: saramaPartitions, ReplicationFactor: e.replicationFactor}, false); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	saramaWaitTopic(t, e, topic, saramaPartitions)
	ap, err := sarama.NewAsyncProducer(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewAsyncProducer: %v", err)
	}
	acks := asyncProduce(t, ap, topic, 0, 2000)
	if err := ap.Close(); err != nil {
		t.Fatalf("closing the AsyncProducer: %v", err)
	}
	_, ends := checkAcks(t, acks, saramaPartitions)

	group := uniqueName("sarama-two-group")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	members := make([]*countingHandler, 2)
	groups := make([]sarama.ConsumerGroup, 2)
	var wg sync.WaitGroup
	for i := range members {
		members[i] = &countingHandler{read: map[int32]map[int64]bool{}}
		cg, err := sarama.NewConsumerGroup(e.bootstrap, group, cfg)
		if err != nil {
			t.Fatalf("NewConsumerGroup: %v", err)
		}
		groups[i] = cg
		wg.Add(1)
		go func(h *countingHandler) {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := cg.Consume(ctx, []string{topic}, h); err != nil && !errors.Is(err, context.Canceled) &&
					!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
					t.Errorf("Consume: %v", err)
					return
				}
			}
		}(members[i])
	}
	waitFor(t, "two members split the partitions and read every record", 80*time.Second, func() error {
		union := map[int32]map[int64]bool{}
		var claims [2]int
		for i, h := range members {
			h.mu.Lock()
			claims[i] = len(h.claims)
			for p, os := range h.read {
				if union[p] == nil {
					union[p] = map[int64]bool{}
				}
				for o := range os {
					union[p][o] = true
				}
			}
			h.mu.Unlock()
		}
		if claims[0] != 2 || claims[1] != 2 {
			return fmt.Errorf("claims %v, want 2 and 2", claims)
		}
		for p := int32(0); p < saramaPartitions; p++ {
			if int64(len(union[p])) != ends[p] {
				return fmt.Errorf("partition %d: %d of %d read", p, len(union[p]), ends[p])
			}
		}
		return nil
	})
	ds, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(ds) != 1 || ds[0].State != "Stable" || ds[0].Protocol != "sticky" || len(ds[0].Members) != 2 {
		t.Fatalf("DescribeConsumerGroups: %v %+v", err, ds)
	}
	cancel()
	wg.Wait()
	for _, cg := range groups {
		if err := cg.Close(); err != nil {
			t.Fatalf("closing a consumer group: %v", err)
		}
	}
	checkCommitted(t, admin, group, topic, ends)
}
