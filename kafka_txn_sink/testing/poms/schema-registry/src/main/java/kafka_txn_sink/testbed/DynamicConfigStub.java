package kafka_txn_sink.testbed;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;

import java.util.ArrayList;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

/**
 * The bean that apicurio-common-app-components-config-index's deployment jar (not on Maven
 * Central) would produce at build time: the list of runtime-editable properties, here empty, so
 * the registry's dynamic configuration is off.
 */
@ApplicationScoped
public class DynamicConfigStub {

    @Produces
    @Singleton
    public DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(new ArrayList<>());
    }
}
