from django.db import models


class Order(models.Model):
    email = models.CharField(max_length=200)
    total_cents = models.IntegerField()
