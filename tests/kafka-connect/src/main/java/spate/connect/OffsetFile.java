package spate.connect;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.ObjectInputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;

/**
 * Prints the source offsets a standalone Connect worker keeps in its
 * offset.storage.file.filename, as one JSON array of {"key": ..., "value": ...}.
 *
 * The file is what FileOffsetBackingStore writes: one Java-serialized HashMap from
 * byte[] to byte[], each array the JSON text of the internal converter (a key such as
 * ["file-source",{"filename":"/path"}], a value such as {"position":12345}). The worker
 * rewrites the file in place at each offset commit, so a read that races a commit can
 * find it short: that exits 3 with the error, for the caller to read again.
 */
public final class OffsetFile {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: OffsetFile OFFSET_FILE");
            System.exit(2);
        }
        Object raw;
        try (ObjectInputStream in = new ObjectInputStream(Files.newInputStream(Path.of(args[0])))) {
            raw = in.readObject();
        } catch (java.io.IOException e) {
            System.out.println("unreadable: " + e);
            System.exit(3);
            return;
        }
        if (!(raw instanceof Map<?, ?> map)) {
            throw new AssertionError("expected a Map in " + args[0] + ", found " + raw.getClass());
        }
        ObjectMapper json = new ObjectMapper();
        ArrayNode out = json.createArrayNode();
        for (Map.Entry<?, ?> e : map.entrySet()) {
            ObjectNode entry = out.addObject();
            entry.set("key", parse(json, e.getKey()));
            entry.set("value", parse(json, e.getValue()));
        }
        System.out.println(json.writeValueAsString(out));
    }

    private static JsonNode parse(ObjectMapper json, Object bytes) throws Exception {
        if (bytes == null) {
            return json.nullNode();
        }
        return json.readTree((byte[]) bytes);
    }
}
