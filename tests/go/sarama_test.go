package spatego

// sarama (github.com/IBM/sarama): the SyncProducer and the AsyncProducer with sarama's
// defaults (its default protocol version, acks=1, the FNV hash partitioner), then the
// idempotent AsyncProducer, a ConsumerGroup that reads every record back and commits,
// and the ClusterAdmin's basics.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

const (
	saramaPartitions = 4
	saramaSync       = 500 // one SendMessage each
	saramaSyncBatch  = 500 // one SendMessages
	saramaAsync      = 2000
	saramaIdem       = 1000
	saramaKeys       = 40
)

func saramaConfig(e env) *sarama.Config {
	if e.logLevel != "" {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	}
	cfg := sarama.NewConfig()
	cfg.ClientID = "spate-go-test"
	return cfg
}

func saramaMessage(topic string, seq int) *sarama.ProducerMessage {
	return &sarama.ProducerMessage{
		Topic:    topic,
		Key:      sarama.StringEncoder(fmt.Sprintf("key-%02d", seq%saramaKeys)),
		Value:    sarama.StringEncoder(fmt.Sprintf("sarama-%06d", seq)),
		Headers:  []sarama.RecordHeader{{Key: []byte("seq"), Value: []byte(fmt.Sprint(seq))}},
		Metadata: seq,
	}
}

func ackOf(m *sarama.ProducerMessage) produced {
	seq := m.Metadata.(int)
	return produced{seq: seq, key: fmt.Sprintf("key-%02d", seq%saramaKeys), value: fmt.Sprintf("sarama-%06d", seq),
		partition: m.Partition, offset: m.Offset}
}

// asyncProduce sends n messages from seq on and returns their acks.
func asyncProduce(t *testing.T, p sarama.AsyncProducer, topic string, seq, n int) []produced {
	t.Helper()
	var acks []produced
	var errs []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(acks)+len(errs) < n {
			select {
			case m := <-p.Successes():
				acks = append(acks, ackOf(m))
			case err := <-p.Errors():
				errs = append(errs, err)
			case <-time.After(60 * time.Second):
				errs = append(errs, fmt.Errorf("no answer within 60s after %d acks", len(acks)))
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		p.Input() <- saramaMessage(topic, seq+i)
	}
	<-done
	if len(errs) > 0 {
		t.Fatalf("%d produce errors, first: %v", len(errs), errs[0])
	}
	return acks
}

type saramaHandler struct {
	t      *testing.T
	byPart map[int32]map[int64]produced
	want   int
	done   context.CancelFunc

	mu      sync.Mutex
	lastOff map[int32]int64
	read    int
	claims  map[int32]bool
	bad     error
}

func (h *saramaHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ps := range s.Claims() {
		for _, p := range ps {
			h.claims[p] = true
		}
	}
	return nil
}

func (h *saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *saramaHandler) fail(err error) {
	if h.bad == nil {
		h.bad = err
	}
	h.done()
}

func (h *saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		h.mu.Lock()
		want, ok := h.byPart[m.Partition][m.Offset]
		var seq string
		if len(m.Headers) == 1 && string(m.Headers[0].Key) == "seq" {
			seq = string(m.Headers[0].Value)
		}
		switch {
		case !ok && h.byPart != nil:
			h.fail(fmt.Errorf("read partition %d offset %d, which was never acknowledged", m.Partition, m.Offset))
		case ok && (string(m.Key) != want.key || string(m.Value) != want.value || seq != fmt.Sprint(want.seq)):
			h.fail(fmt.Errorf("read %d/%d as key %q value %q seq %q; %q %q %d was written",
				m.Partition, m.Offset, m.Key, m.Value, seq, want.key, want.value, want.seq))
		}
		if last, seen := h.lastOff[m.Partition]; seen && m.Offset != last+1 {
			h.fail(fmt.Errorf("read %d/%d after %d/%d: skipped or went back", m.Partition, m.Offset, m.Partition, last))
		}
		h.lastOff[m.Partition] = m.Offset
		h.read++
		s.MarkMessage(m, "")
		if h.read == h.want {
			h.done()
		}
		h.mu.Unlock()
	}
	return nil
}

// consumeGroup reads want records as the one member of group, then closes the group
// (which commits what was marked).
func consumeGroup(t *testing.T, e env, cfg *sarama.Config, admin sarama.ClusterAdmin, group, topic string,
	byPart map[int32]map[int64]produced, start map[int32]int64, want int) *saramaHandler {
	t.Helper()
	cg, err := sarama.NewConsumerGroup(e.bootstrap, group, cfg)
	if err != nil {
		t.Fatalf("NewConsumerGroup: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h := &saramaHandler{t: t, byPart: byPart, want: want, done: cancel, lastOff: map[int32]int64{}, claims: map[int32]bool{}}
	for p, o := range start {
		if o > 0 {
			h.lastOff[p] = o - 1
		}
	}
	groupErrs := make(chan error, 100)
	go func() {
		for err := range cg.Errors() {
			groupErrs <- err
		}
	}()
	for ctx.Err() == nil {
		if err := cg.Consume(ctx, []string{topic}, h); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Consume: %v", err)
		}
	}
	h.mu.Lock()
	read, bad := h.read, h.bad
	h.mu.Unlock()
	if bad != nil {
		t.Fatal(bad)
	}
	if read != want {
		t.Fatalf("the group read %d records in 90s, want %d (claims %v)", read, want, h.claims)
	}
	if len(h.claims) != saramaPartitions {
		t.Fatalf("the only member claimed %v, want every partition", h.claims)
	}
	// Still a member (Consume returned, the group is not closed yet): Stable, one member.
	ds, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(ds) != 1 || ds[0].State != "Stable" || ds[0].ProtocolType != "consumer" || ds[0].Protocol != "range" || len(ds[0].Members) != 1 {
		t.Fatalf("DescribeConsumerGroups with one member: %v %+v", err, ds)
	}
	if err := cg.Close(); err != nil {
		t.Fatalf("closing the consumer group: %v", err)
	}
	select {
	case err := <-groupErrs:
		t.Fatalf("consumer group error: %v", err)
	default:
	}
	return h
}

func checkCommitted(t *testing.T, admin sarama.ClusterAdmin, group, topic string, ends map[int32]int64) {
	t.Helper()
	parts := make([]int32, 0, saramaPartitions)
	for p := int32(0); p < saramaPartitions; p++ {
		parts = append(parts, p)
	}
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
	if err != nil {
		t.Fatalf("ListConsumerGroupOffsets: %v", err)
	}
	for _, p := range parts {
		b := resp.GetBlock(topic, p)
		if b == nil || b.Err != sarama.ErrNoError || b.Offset != ends[p] {
			t.Fatalf("committed offset of %s/%d: %+v, want the end offset %d", topic, p, b, ends[p])
		}
	}
}

// TestSarama: sarama's producers, consumer group and cluster admin.
func TestSarama(t *testing.T) {
	e := loadEnv(t)
	cfg := saramaConfig(e)
	admin, err := sarama.NewClusterAdmin(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewClusterAdmin: %v", err)
	}
	defer admin.Close()

	brokers, controller, err := admin.DescribeCluster()
	if err != nil {
		t.Fatalf("DescribeCluster: %v", err)
	}
	ids := map[int32]bool{}
	for _, b := range brokers {
		ids[b.ID()] = true
	}
	if len(brokers) != e.brokers || len(ids) != e.brokers || !ids[controller] {
		t.Fatalf("DescribeCluster: %d brokers %v, controller %d; want %d brokers, the controller among them", len(brokers), ids, controller, e.brokers)
	}

	topic := uniqueName("sarama")
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: saramaPartitions, ReplicationFactor: e.replicationFactor,
		ConfigEntries: map[string]*string{"max.message.bytes": strp("2000000")}}, false); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	saramaWaitTopic(t, e, topic, saramaPartitions)
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		t.Fatalf("creating %s twice: %v, want ErrTopicAlreadyExists", topic, err)
	}
	waitFor(t, "ListTopics shows the topic", 30*time.Second, func() error {
		ts, err := admin.ListTopics()
		if err != nil {
			return err
		}
		d, ok := ts[topic]
		if !ok || d.NumPartitions != saramaPartitions || d.ReplicationFactor != e.replicationFactor {
			return fmt.Errorf("ListTopics %s: %+v (listed: %v)", topic, d, ok)
		}
		if v := d.ConfigEntries["max.message.bytes"]; v == nil || *v != "2000000" {
			return fmt.Errorf("ListTopics %s: max.message.bytes %v, want 2000000", topic, v)
		}
		return nil
	})
	tms, err := admin.DescribeTopics([]string{topic})
	if err != nil || len(tms) != 1 || tms[0].Err != sarama.ErrNoError || len(tms[0].Partitions) != saramaPartitions {
		t.Fatalf("DescribeTopics: %v %+v", err, tms)
	}
	for _, p := range tms[0].Partitions {
		if !ids[p.Leader] || len(p.Replicas) != int(e.replicationFactor) {
			t.Fatalf("DescribeTopics %s/%d: leader %d replicas %v", topic, p.ID, p.Leader, p.Replicas)
		}
	}
	// Configs: an alter answered by one broker is seen by the others once their
	// metadata catches up (in Kafka too), so the reads wait for the new values.
	type cv struct {
		value  string
		source sarama.ConfigSource
	}
	waitConfigs := func(what string, want map[string]cv) {
		t.Helper()
		start := time.Now()
		waitFor(t, what, 15*time.Second, func() error {
			entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic})
			if err != nil {
				return err
			}
			got := map[string]cv{}
			for _, c := range entries {
				if _, ok := want[c.Name]; ok {
					got[c.Name] = cv{c.Value, c.Source}
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("DescribeConfig %s: %v, want %v", topic, got, want)
			}
			return nil
		})
		t.Logf("%s: seen after %v", what, time.Since(start).Round(time.Millisecond))
	}
	waitConfigs("configs at creation", map[string]cv{
		"max.message.bytes": {"2000000", sarama.SourceTopic},
		"retention.ms":      {"604800000", sarama.SourceDefault},
	})
	if err := admin.IncrementalAlterConfig(sarama.TopicResource, topic, map[string]sarama.IncrementalAlterConfigsEntry{
		"retention.ms": {Operation: sarama.IncrementalAlterConfigsOperationSet, Value: strp("7200000")}}, false); err != nil {
		t.Fatalf("IncrementalAlterConfig: %v", err)
	}
	// The incremental alter keeps max.message.bytes.
	waitConfigs("configs after IncrementalAlterConfig", map[string]cv{
		"max.message.bytes": {"2000000", sarama.SourceTopic},
		"retention.ms":      {"7200000", sarama.SourceTopic},
	})
	// AlterConfig (the legacy, non-incremental API) replaces the whole set.
	if err := admin.AlterConfig(sarama.TopicResource, topic, map[string]*string{"retention.bytes": strp("5000000")}, false); err != nil {
		t.Fatalf("AlterConfig: %v", err)
	}
	waitConfigs("configs after AlterConfig", map[string]cv{
		"max.message.bytes": {"1048588", sarama.SourceDefault},
		"retention.ms":      {"604800000", sarama.SourceDefault},
		"retention.bytes":   {"5000000", sarama.SourceTopic},
	})

	// SyncProducer, defaults (acks=1; Return.Successes is required by it).
	cfg.Producer.Return.Successes = true
	var acks []produced
	sp, err := sarama.NewSyncProducer(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewSyncProducer: %v", err)
	}
	for i := 0; i < saramaSync; i++ {
		m := saramaMessage(topic, i)
		p, o, err := sp.SendMessage(m)
		if err != nil {
			t.Fatalf("SendMessage %d: %v", i, err)
		}
		if p != m.Partition || o != m.Offset {
			t.Fatalf("SendMessage returned %d/%d, the message says %d/%d", p, o, m.Partition, m.Offset)
		}
		acks = append(acks, ackOf(m))
	}
	batch := make([]*sarama.ProducerMessage, 0, saramaSyncBatch)
	for i := 0; i < saramaSyncBatch; i++ {
		batch = append(batch, saramaMessage(topic, saramaSync+i))
	}
	if err := sp.SendMessages(batch); err != nil {
		t.Fatalf("SendMessages: %v", err)
	}
	for _, m := range batch {
		acks = append(acks, ackOf(m))
	}
	if err := sp.Close(); err != nil {
		t.Fatalf("closing the SyncProducer: %v", err)
	}

	// AsyncProducer, defaults.
	ap, err := sarama.NewAsyncProducer(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewAsyncProducer: %v", err)
	}
	acks = append(acks, asyncProduce(t, ap, topic, saramaSync+saramaSyncBatch, saramaAsync)...)
	if err := ap.Close(); err != nil {
		t.Fatalf("closing the AsyncProducer: %v", err)
	}

	// The idempotent AsyncProducer (sarama's rules for it: acks=all, one request in flight).
	idemCfg := saramaConfig(e)
	idemCfg.Producer.Return.Successes = true
	idemCfg.Producer.Idempotent = true
	idemCfg.Producer.RequiredAcks = sarama.WaitForAll
	idemCfg.Net.MaxOpenRequests = 1
	ip, err := sarama.NewAsyncProducer(e.bootstrap, idemCfg)
	if err != nil {
		t.Fatalf("NewAsyncProducer (idempotent): %v", err)
	}
	acks = append(acks, asyncProduce(t, ip, topic, saramaSync+saramaSyncBatch+saramaAsync, saramaIdem)...)
	if err := ip.Close(); err != nil {
		t.Fatalf("closing the idempotent AsyncProducer: %v", err)
	}
	total := saramaSync + saramaSyncBatch + saramaAsync + saramaIdem
	if len(acks) != total {
		t.Fatalf("%d acks for %d records", len(acks), total)
	}
	byPart, ends := checkAcks(t, acks, saramaPartitions)

	client, err := sarama.NewClient(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	defer client.Close()
	for p := int32(0); p < saramaPartitions; p++ {
		newest, err1 := client.GetOffset(topic, p, sarama.OffsetNewest)
		oldest, err2 := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err1 != nil || err2 != nil || newest != ends[p] || oldest != 0 {
			t.Fatalf("partition %d: GetOffset says [%d, %d) (%v %v), the acks [0, %d)", p, oldest, newest, err1, err2, ends[p])
		}
	}

	// A consumer group from the oldest offset (sarama's default is the newest: it would
	// read nothing already written) reads everything and commits.
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	group := uniqueName("sarama-group")
	consumeGroup(t, e, cfg, admin, group, topic, byPart, nil, total)
	checkCommitted(t, admin, group, topic, ends)
	groups, err := admin.ListConsumerGroups()
	if err != nil {
		t.Fatalf("ListConsumerGroups: %v", err)
	}
	if pt, ok := groups[group]; !ok || pt != "consumer" {
		t.Fatalf("ListConsumerGroups: %s -> %q (listed %v)", group, pt, ok)
	}
	ds, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(ds) != 1 || ds[0].State != "Empty" || len(ds[0].Members) != 0 {
		t.Fatalf("DescribeConsumerGroups after the member left: %v %+v", err, ds)
	}

	// More records; the same group, started again, resumes at its committed offsets
	// and reads only those.
	const more = 200
	ap2, err := sarama.NewAsyncProducer(e.bootstrap, cfg)
	if err != nil {
		t.Fatalf("NewAsyncProducer: %v", err)
	}
	acks = append(acks, asyncProduce(t, ap2, topic, total, more)...)
	if err := ap2.Close(); err != nil {
		t.Fatalf("closing the AsyncProducer: %v", err)
	}
	byPart, ends2 := checkAcks(t, acks, saramaPartitions)
	consumeGroup(t, e, cfg, admin, group, topic, byPart, ends, more)
	checkCommitted(t, admin, group, topic, ends2)

	if err := admin.DeleteConsumerGroup(group); err != nil {
		t.Fatalf("DeleteConsumerGroup: %v", err)
	}
	if err := admin.DeleteTopic(topic); err != nil {
		t.Fatalf("DeleteTopic: %v", err)
	}
	waitFor(t, "the deleted topic leaves ListTopics", 30*time.Second, func() error {
		ts, err := admin.ListTopics()
		if err != nil {
			return err
		}
		if _, ok := ts[topic]; ok {
			return fmt.Errorf("%s still listed", topic)
		}
		return nil
	})
	t.Logf("sarama: %d records over %d partitions (%v), read back by a consumer group, then %d more", total, saramaPartitions, ends, more)
}

// saramaWaitTopic waits until every broker's own metadata shows topic with the given
// number of partitions, each with a leader (brokers learn of a new topic after the
// coordinator answered CreateTopics, in Kafka too).
func saramaWaitTopic(t *testing.T, e env, topic string, partitions int) {
	t.Helper()
	client, err := sarama.NewClient(e.bootstrap, saramaConfig(e))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	defer client.Close()
	waitFor(t, fmt.Sprintf("every broker knows %s with %d partitions", topic, partitions), 30*time.Second, func() error {
		if err := client.RefreshMetadata(); err != nil {
			return err
		}
		brokers := client.Brokers()
		if len(brokers) != e.brokers {
			return fmt.Errorf("%d brokers known", len(brokers))
		}
		for _, b := range brokers {
			if err := b.Open(client.Config()); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
				return err
			}
			md, err := b.GetMetadata(&sarama.MetadataRequest{Version: 1, Topics: []string{topic}})
			if err != nil {
				return fmt.Errorf("broker %d: %w", b.ID(), err)
			}
			if len(md.Topics) != 1 || md.Topics[0].Err != sarama.ErrNoError || len(md.Topics[0].Partitions) != partitions {
				return fmt.Errorf("broker %d: %+v", b.ID(), md.Topics)
			}
			for _, p := range md.Topics[0].Partitions {
				if p.Err != sarama.ErrNoError || p.Leader < 0 {
					return fmt.Errorf("broker %d: partition %d leader %d %v", b.ID(), p.ID, p.Leader, p.Err)
				}
			}
		}
		return nil
	})
}
