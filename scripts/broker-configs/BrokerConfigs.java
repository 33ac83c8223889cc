// Prints Apache Kafka's broker ConfigDef as tab-separated lines, for
// scripts/gen-broker-configs: name, type, default, update mode, whether Kafka takes it
// dynamically only with a listener prefix, whether it is internal (not described),
// validator kind and its arguments.
import java.lang.reflect.Field;
import java.util.*;
import org.apache.kafka.common.config.ConfigDef;

public class BrokerConfigs {
    static Object field(Object o, String name) throws Exception {
        Class<?> c = o.getClass();
        while (c != null) {
            try {
                Field f = c.getDeclaredField(name);
                f.setAccessible(true);
                return f.get(o);
            } catch (NoSuchFieldException e) {
                c = c.getSuperclass();
            }
        }
        throw new NoSuchFieldException(o.getClass() + "." + name);
    }

    static String join(Collection<?> values) {
        List<String> out = new ArrayList<>();
        for (Object v : values) out.add(String.valueOf(v));
        return String.join(",", out);
    }

    static String validator(ConfigDef.ConfigKey k) throws Exception {
        Object v = k.validator;
        if (v == null) return "none";
        String kind = v.getClass().getSimpleName();
        switch (kind) {
            case "Range":
                return "range\t" + field(v, "min") + "\t" + field(v, "max");
            case "ValidString":
                return "one_of\t" + join((Collection<?>) field(v, "validStrings"));
            case "CaseInsensitiveValidString":
                return "one_of_ignore_case\t" + join((Collection<?>) field(v, "validStrings"));
            case "ValidList": {
                Object s = field(v, "validString");
                return "list\t" + join((Collection<?>) field(s, "validStrings")) + "\t" + field(v, "isEmptyAllowed");
            }
            case "NonEmptyString":
            case "NonNullValidator":
                return "non_empty";
            case "ControllerQuorumVotersValidator":
            case "ControllerQuorumBootstrapServersValidator":
                return "list\t\tfalse";
            default:
                return "other\t" + v.toString();
        }
    }

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws Exception {
        ConfigDef def = org.apache.kafka.server.config.AbstractKafkaConfig.CONFIG_DEF;
        Class<?> dynamic = Class.forName("org.apache.kafka.server.config.DynamicBrokerConfig");
        Map<String, String> modes = (Map<String, String>) dynamic.getMethod("dynamicConfigUpdateModes").invoke(null);
        Set<String> security = (Set<String>) dynamic.getField("DYNAMIC_SECURITY_CONFIGS").get(null);
        for (ConfigDef.ConfigKey k : new TreeMap<>(def.configKeys()).values()) {
            String dflt = !k.hasDefault() ? "\\none" : k.defaultValue == null ? "\\null"
                : ConfigDef.convertToString(k.defaultValue, k.type);
            String mode = modes.getOrDefault(k.name, "read-only");
            System.out.println(String.join("\t", k.name, k.type.name(), dflt, mode,
                String.valueOf(security.contains(k.name)), String.valueOf(k.internalConfig), validator(k)));
        }
    }
}
