from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('forecasting', '0008_condition_readings_from_forecasts'),
    ]

    operations = [
        migrations.AlterField(
            model_name='forecast',
            name='kind',
            field=models.CharField(choices=[('eta', 'Eta'), ('loss', 'Loss'), ('deadline', 'Deadline'), ('slip', 'Slip'), ('straggler', 'Straggler')], max_length=16),
        ),
    ]
